"""Builds the kernels' C libraries (splat/kernels/splat_api.h) with the
system compiler: no torch, no Python headers.  Used by setup.py (read with
runpy, without importing splat) and as the just-in-time fallback of
splat/_native.py when the package holds no built library.

    libsplat_cpu.so   every CPU kernel, OpenMP (g++ or $CXX)
    libsplat_cuda.so  the CUDA kernels (nvcc; see build_cuda_library)
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"
CPU_LIBRARY = {"linux": "libsplat_cpu.so", "darwin": "libsplat_cpu.dylib", "win32": "splat_cpu.dll"}
CUDA_LIBRARY = {"linux": "libsplat_cuda.so", "win32": "splat_cuda.dll"}
# The seven architectures of the wheel; PTX of the newest is added for later GPUs.
CUDA_ARCHS = ("75", "80", "86", "89", "90", "100", "120")


def library_name(kind: str) -> str:
    """The file name of the "cpu" or "cuda" library on this platform."""
    table = CPU_LIBRARY if kind == "cpu" else CUDA_LIBRARY
    return table.get(sys.platform, table["linux"])


def cpu_sources() -> list[Path]:
    """Every source of the CPU library: the C ABI and the kernels."""
    return [KERNELS / "capi_cpu.cpp"] + sorted((KERNELS / "cpu").glob("*.cpp"))


def _flags() -> tuple[list[str], list[str]]:
    flags = runpy.run_path(str(Path(__file__).resolve().parent / "_compile_flags.py"))
    # -DNDEBUG -fwrapv -O3: what Python's sysconfig added to the torch extension
    # build, so that the code generated is that of today's splat._C.
    return ["-DNDEBUG", "-fwrapv", "-fPIC", "-fvisibility=hidden", *flags["CXX_FLAGS"]], flags["LINK_FLAGS"]


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")


def build_cpu_library(out: Path, build_dir: Path, jobs: int | None = None) -> Path:
    """Compiles cpu_sources() into the shared library `out` (objects in build_dir)."""
    cxx = os.environ.get("CXX", "g++")
    cflags, lflags = _flags()
    build_dir.mkdir(parents=True, exist_ok=True)
    objects = [build_dir / (p.stem + ".o") for p in cpu_sources()]

    def compile_one(pair):
        src, obj = pair
        _run([cxx, *cflags, f"-I{KERNELS}", "-c", str(src), "-o", str(obj)])

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, zip(cpu_sources(), objects)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    _run([cxx, "-shared", *[str(o) for o in objects], *lflags, "-o", str(tmp)])
    os.replace(tmp, out)  # atomic: a concurrent loader never sees half a file
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else KERNELS.parent / library_name("cpu")
    print(build_cpu_library(target, target.parent / "build_native"))
