"""Builds (just in time, cached) the CUDA emulation harness: the project's
UNCHANGED ``splat/kernels/cuda/*.cu`` compiled by the host C++ compiler
against the cudaemu shim (``shim/``), plus the shared host call sequence
(``cuda/host_sequence.h``) bound to Python.

The build goes through ``torch.utils.cpp_extension.load`` like splat's own JIT
extension, under its own name, in ``$TORCH_EXTENSIONS_DIR`` (ninja rebuilds
only what changed, headers included).

Environment (for the mutation and sanitizer scripts):
    SPLAT_CUDAEMU_KERNELS   folder with KERNEL_FILES (the .cu files and the
                            primitives' batch headers) to build instead of the
                            project's (a mutant's copy); the other headers
                            still come from the project.
    SPLAT_CUDAEMU_SANITIZE  1: build with -fsanitize=address,undefined (the
                            process must preload libasan, see scripts/).
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KERNELS = ROOT / "splat" / "kernels"
CU_FILES = ("binning.cu", "forward.cu", "backward.cu")
# Device-only headers of the kernels, taken from the same folder as the .cu
# files (copied next to their rewrites, where the .cu files' includes find
# them first), so a mutant may edit them too.
KERNEL_HEADERS = ("surfel_batch.cuh", "gaussian_batch.cuh")
KERNEL_FILES = CU_FILES + KERNEL_HEADERS


def kernel_dir() -> Path:
    return Path(os.environ.get("SPLAT_CUDAEMU_KERNELS", KERNELS / "cuda")).resolve()


def _name_and_folder(kdir: Path, sanitize: bool) -> tuple[str, str]:
    """The module name and the build folder's name.

    Other kernels (a mutant's copy) build in one folder of their own, shared by
    every such copy, under the same module name: only the rewritten .cu objects
    differ between two copies, so ninja recompiles just those and keeps the
    torch-heavy bindings object (most of the build time).  Two copies must
    therefore not be built at the same time (scripts/cuda_mutants.py runs them
    one after another)."""
    name = "splat_cudaemu" + ("_san" if sanitize else "")
    folder = name if kdir == (KERNELS / "cuda").resolve() else name + "_other_kernels"
    return name, folder


def build(verbose: bool = False):
    """Returns the emulation module (forward, backward, configure, stats, selftest)."""
    import torch.utils.cpp_extension as ext

    kdir = kernel_dir()
    sanitize = os.environ.get("SPLAT_CUDAEMU_SANITIZE") == "1"
    name, folder = _name_and_folder(kdir, sanitize)
    build_dir = Path(ext._get_build_directory(folder, verbose))
    gen = build_dir / "rewritten"
    gen.mkdir(parents=True, exist_ok=True)
    from .rewrite import copy_if_changed, rewrite_file

    sources = [str(HERE / "emu_bindings.cpp"), str(HERE / "shim" / "cudaemu_runtime.cpp")]
    for cu in [kdir / f for f in CU_FILES] + [HERE / "selftest.cu"]:
        out = gen / (cu.stem + "_cu.cpp")
        rewrite_file(cu, out)
        sources.append(str(out))
    for header in KERNEL_HEADERS:
        copy_if_changed(kdir / header, gen / header)
    # -ffp-contract=off: no fused multiply-adds, like nvcc --fmad=false and the
    # CPU backend, so the emulated forward is bitwise equal to the CPU one.
    # -iquote: the .cu files' relative includes ("../core.h", "rasterize_cuda.h")
    # resolve against the project's kernel folder, not the generated copy's.
    cflags = ["-O2", "-g", "-std=c++17", "-ffp-contract=off", "-Wno-unknown-pragmas", "-iquote", str(KERNELS / "cuda")]
    ldflags = []
    if sanitize:
        cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
        ldflags += ["-fsanitize=address,undefined"]
    return ext.load(
        name=name,
        sources=sources,
        build_directory=str(build_dir),
        extra_include_paths=[str(HERE / "shim"), str(KERNELS)],
        extra_cflags=cflags,
        extra_ldflags=ldflags,
        verbose=verbose,
    )
