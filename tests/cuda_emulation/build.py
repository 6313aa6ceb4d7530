"""Builds (just in time, cached) the CUDA emulation library: the project's
UNCHANGED ``splat/kernels/cuda/*.cu`` compiled by the host C++ compiler
against the cudaemu shim (``shim/``), with the C ABI of the CUDA kernels
(``splat/kernels/capi_cuda.cpp``, so the very host call sequence
``cuda/host_sequence.h``) and the harness's controls (``emu_capi.cpp``).

The library is loaded through the same Python code as the real
libsplat_cuda.so (``splat._native_cuda.CudaKernels``, in its emulated mode:
CPU tensors, no stream), so the parity tests exercise the C boundary, the
descriptors and the allocator callback that GPU users go through.

It is a plain shared library (no torch, no Python headers): each object is
cached under a key of its source, the headers it may include and the flags,
in ``$SPLAT_CUDAEMU_BUILD_DIR`` (default ``~/.cache/splat/cudaemu``), so a
mutant's copy of the kernels recompiles only the rewritten .cu objects.

Environment (for the mutation and sanitizer scripts):
    SPLAT_CUDAEMU_KERNELS   folder with KERNEL_FILES (the .cu files and the
                            primitives' batch headers) to build instead of the
                            project's (a mutant's copy); the other headers
                            still come from the project.
    SPLAT_CUDAEMU_SANITIZE  1: build with -fsanitize=address,undefined (the
                            process must preload libasan, see scripts/).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KERNELS = ROOT / "splat" / "kernels"
SHIM = HERE / "shim"
CU_FILES = ("binning.cu", "forward.cu", "backward.cu", "project.cu")
# Device-only headers of the kernels, taken from the same folder as the .cu
# files (copied next to their rewrites, where the .cu files' includes find
# them first), so a mutant may edit them too.
KERNEL_HEADERS = ("surfel_batch.cuh", "gaussian_batch.cuh")
KERNEL_FILES = CU_FILES + KERNEL_HEADERS


def kernel_dir() -> Path:
    return Path(os.environ.get("SPLAT_CUDAEMU_KERNELS", KERNELS / "cuda")).resolve()


def build_root() -> Path:
    return Path(os.environ.get("SPLAT_CUDAEMU_BUILD_DIR") or Path.home() / ".cache" / "splat" / "cudaemu")


def _flags(sanitize: bool) -> tuple[list[str], list[str]]:
    # -ffp-contract=off: no fused multiply-adds, like nvcc --fmad=false and the
    # CPU backend, so the emulated forward is bitwise equal to the CPU one.
    # -iquote: the .cu files' relative includes ("../core.h", "rasterize_cuda.h")
    # resolve against the project's kernel folder, not the generated copy's.
    cflags = ["-O2", "-g", "-std=c++17", "-fPIC", "-ffp-contract=off", "-Wno-unknown-pragmas"]
    cflags += ["-DSPLAT_CUDAEMU", "-iquote", str(KERNELS / "cuda"), "-I", str(SHIM), "-I", str(KERNELS)]
    ldflags = []
    if sanitize:
        cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
        ldflags += ["-fsanitize=address,undefined"]
    return cflags, ldflags


def _headers_digest(folders: list[Path]) -> str:
    """The text of every header a source may include (conservative: all of them)."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in (".h", ".cuh", ""):
                h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


_users: list = []  # this process's shared locks on the folders it loaded from


class _locked:
    """Holds `root`'s build lock (builds take turns); may_prune() says whether
    no other process uses the folder (then files of other builds may go).  On
    exit this process is registered as a user for its lifetime (a shared lock),
    so no other build prunes the library it loads."""

    def __init__(self, root: Path):
        self.build = open(root / ".build.lock", "w")  # noqa: SIM115 (closed in __exit__)
        self.use = open(root / ".use.lock", "w")  # noqa: SIM115 (kept open: the process's use)

    def __enter__(self):
        fcntl.flock(self.build, fcntl.LOCK_EX)
        return self.may_prune

    def may_prune(self) -> bool:
        try:
            fcntl.flock(self.use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def __exit__(self, *exc):
        fcntl.flock(self.use, fcntl.LOCK_SH)
        _users.append(self.use)
        self.build.close()


def _compile(cxx: str, src: Path, obj: Path, cflags: list[str]) -> None:
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run([cxx, *cflags, "-c", str(src), "-o", str(tmp)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {src} for the CUDA emulation failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, obj)


def build_library(verbose: bool = False) -> Path:
    """Compiles (or finds in the cache) the emulation library; returns its path."""
    from .rewrite import copy_if_changed, rewrite_file

    kdir = kernel_dir()
    sanitize = os.environ.get("SPLAT_CUDAEMU_SANITIZE") == "1"
    cxx = os.environ.get("CXX", "g++")
    cflags, ldflags = _flags(sanitize)
    # One folder per checkout and build kind (plain or sanitized, the project's
    # kernels or another copy: a mutant's), so every mutant copy reuses the
    # objects that do not depend on the kernels; builds in one folder take
    # turns, and files of other builds are pruned only while no other process
    # uses the folder (_locked).
    project = kdir == (KERNELS / "cuda").resolve()
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]
    kind = ("sanitize" if sanitize else "plain") + ("" if project else "-other-kernels")
    root = build_root() / f"{checkout}-{kind}"
    gen = root / "rewritten"
    gen.mkdir(parents=True, exist_ok=True)
    objects_dir = root / "objects"
    objects_dir.mkdir(exist_ok=True)

    with _locked(root) as may_prune:
        sources = [KERNELS / "capi_cuda.cpp", HERE / "emu_capi.cpp", SHIM / "cudaemu_runtime.cpp"]
        for cu in [kdir / f for f in CU_FILES] + [HERE / "selftest.cu"]:
            out = gen / (cu.stem + "_cu.cpp")
            rewrite_file(cu, out)
            sources.append(out)
        for header in KERNEL_HEADERS:
            copy_if_changed(kdir / header, gen / header)

        project_headers = _headers_digest([KERNELS, SHIM])
        kernel_headers = _headers_digest([gen])
        flag_text = "\0".join([cxx, *cflags])
        objects, todo = [], []
        for src in sources:
            key = hashlib.sha256(
                b"\0".join(
                    [src.name.encode(), src.read_bytes(), project_headers.encode(), flag_text.encode()]
                    + ([kernel_headers.encode()] if src.parent == gen else [])
                )
            ).hexdigest()[:20]
            obj = objects_dir / f"{src.stem}-{key}.o"
            objects.append(obj)
            if not obj.exists():
                todo.append((src, obj))
        if verbose and todo:
            print(f"cuda_emulation: compiling {len(todo)} of {len(sources)} sources into {objects_dir}")
        with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            list(pool.map(lambda pair: _compile(cxx, pair[0], pair[1], cflags), todo))

        link_key = hashlib.sha256("\0".join([o.name for o in objects] + ldflags).encode()).hexdigest()[:20]
        lib = root / f"libsplat_cudaemu-{link_key}.so"
        if not lib.exists():
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            done = subprocess.run(
                [cxx, "-shared", *[str(o) for o in objects], *ldflags, "-o", str(tmp)], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise RuntimeError(f"linking the CUDA emulation library failed:\n{done.stderr[-4000:]}")
            os.replace(tmp, lib)
        for stale in [*objects_dir.glob("*.o"), *root.glob("libsplat_cudaemu-*.so")] if may_prune() else []:
            if stale not in objects and stale != lib:
                stale.unlink(missing_ok=True)
        return lib


class Emulator:
    """The emulated CUDA kernels, called like the real ones: forward, backward,
    forward_gaussians, backward_gaussians, project_forward, project_backward,
    project_gaussians_forward, project_gaussians_backward take and return what
    forward_cuda ... project_gaussians_backward_cuda do (on CPU tensors), through
    splat._native_cuda.CudaKernels; plus the harness's controls."""

    def __init__(self, path: Path):
        from splat._native_cuda import CudaKernels

        self.kernels = CudaKernels(path, emulated=True)
        lib = self.kernels._lib
        lib.cudaemu_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]
        lib.cudaemu_configure.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
        lib.cudaemu_stats.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        lib.cudaemu_run_selftest.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self._lib = lib
        self.__file__ = str(path)
        self.forward = self.kernels.forward_cuda
        self.backward = self.kernels.backward_cuda
        self.forward_gaussians = self.kernels.forward_gaussians_cuda
        self.backward_gaussians = self.kernels.backward_gaussians_cuda
        self.project_forward = self.kernels.project_forward_cuda
        self.project_backward = self.kernels.project_backward_cuda
        self.project_gaussians_forward = self.kernels.project_gaussians_forward_cuda
        self.project_gaussians_backward = self.kernels.project_gaussians_backward_cuda

    def configure(self, thread_order: str, block_order: str, poison: int, seed: int) -> None:
        """Thread order, block order (fwd|rev|rand), the shared-memory poison byte, seed."""
        err = ctypes.create_string_buffer(256)
        if self._lib.cudaemu_configure(thread_order.encode(), block_order.encode(), poison, seed, err, 256):
            raise RuntimeError(err.value.decode())

    def stats(self) -> list[int]:
        """[launches, blocks, fiber switches] so far."""
        out = (ctypes.c_int64 * 3)()
        self._lib.cudaemu_stats(out)
        return list(out)

    def selftest(self, name: str) -> str:
        """Runs a known-bad (or good) kernel of selftest.cu: "ok" or the emulator's message."""
        out = ctypes.create_string_buffer(4096)
        self._lib.cudaemu_run_selftest(name.encode(), out, 4096)
        return out.value.decode(errors="replace")


def build(verbose: bool = False) -> Emulator:
    """Returns the emulated kernels (forward, backward, forward_gaussians,
    backward_gaussians, configure, stats, selftest)."""
    return Emulator(build_library(verbose))
