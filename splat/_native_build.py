"""Builds the kernels' C libraries (splat/kernels/splat_api.h) with the
system compiler: no torch, no Python headers.  Used by setup.py (read with
runpy, without importing splat) and as the just-in-time fallback of
splat/_native.py when the package holds no built library.

    libsplat_cpu.so   every CPU kernel, OpenMP (toolchain(): g++ on Linux, clang++ elsewhere, or $CXX)
    libsplat_cuda.so  the CUDA kernels and their C ABI (nvcc; see build_cuda_library)
"""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"
CPU_LIBRARY = {"linux": "libsplat_cpu.so", "darwin": "libsplat_cpu.dylib", "win32": "splat_cpu.dll"}
CUDA_LIBRARY = {"linux": "libsplat_cuda.so", "win32": "splat_cuda.dll"}
# The seven architectures of the wheel; PTX of the newest is added for later GPUs.
CUDA_ARCHS = ("75", "80", "86", "89", "90", "100", "120")
# nvcc's flags for kernels that round like the CPU library: no fused
# multiply-add, no flush of denormals to zero, IEEE division and square root
# (SPLAT_CUDA_EXACT=0 drops them: setup.py).
CUDA_EXACT_FLAGS = ("--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")


def library_name(kind: str) -> str:
    """The file name of the "cpu" or "cuda" library on this platform."""
    table = CPU_LIBRARY if kind == "cpu" else CUDA_LIBRARY
    return table.get(sys.platform, table["linux"])


def cpu_sources() -> list[Path]:
    """Every source of the CPU library: the C ABI and the kernels."""
    return [KERNELS / "capi_cpu.cpp"] + sorted((KERNELS / "cpu").glob("*.cpp"))


def cuda_sources() -> list[Path]:
    """Every source of the CUDA library: its C ABI and the kernels."""
    return [KERNELS / "capi_cuda.cpp"] + sorted((KERNELS / "cuda").glob("*.cu"))


def parse_cuda_archs(spec: str) -> tuple[list[int], list[int]]:
    """(SASS, PTX) architectures of a SPLAT_CUDA_ARCHS value, as 10 * major +
    minor: "all" is the wheel's seven with PTX of the newest; else numbers
    ("80", "8.6", "sm_90"), separated by spaces, commas or semicolons, each
    "+PTX" adding PTX for that architecture too (torch's spelling)."""
    spec = spec.strip()
    if spec == "all":
        return [int(a) for a in CUDA_ARCHS], [int(CUDA_ARCHS[-1])]
    sass, ptx = [], []
    for word in spec.replace(",", " ").replace(";", " ").split():
        number = word.removesuffix("+PTX").removeprefix("sm_").removeprefix("compute_").replace(".", "")
        if not number.isdigit():
            raise ValueError(f"SPLAT_CUDA_ARCHS: {word!r} is not an architecture (e.g. 86, 8.6, 12.0+PTX or all)")
        sass.append(int(number))
        if word.endswith("+PTX"):
            ptx.append(int(number))
    if not sass:
        raise ValueError(f"SPLAT_CUDA_ARCHS names no architecture: {spec!r}")
    return sass, ptx


def cuda_arch_flags(sass: list[int], ptx: list[int]) -> tuple[list[str], str]:
    """nvcc's -gencode flags and the same list as splat_cuda_archs() reports it."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in sass]
    flags += [f"-gencode=arch=compute_{a},code=compute_{a}" for a in ptx]
    return flags, " ".join([f"sm_{a}" for a in sass] + [f"compute_{a}" for a in ptx])


def build_cuda_library(out: Path, build_dir: Path, archs: str = "all", jobs: int | None = None) -> Path:
    """Compiles cuda_sources() with nvcc ($NVCC, default nvcc) into `out`.

    Size: SASS only for the architectures asked for (PTX only for the last, by
    default), every fatbin compressed (-Xfatbin -compress-all), symbols
    stripped and the static CUDA runtime's kept local (--exclude-libs).  The
    runtime is linked statically (-cudart static): the library needs only the
    driver, libcuda.so.1, which the runtime opens itself."""
    nvcc = os.environ.get("NVCC", "nvcc")
    sass, ptx = parse_cuda_archs(archs)
    gencode, listed = cuda_arch_flags(sass, ptx)
    common = ["-std=c++17", "-O3", "-DNDEBUG", f"-I{KERNELS}", "-Xcompiler=-fPIC,-fvisibility=hidden"]
    if os.environ.get("SPLAT_CUDA_EXACT", "1") != "0":
        common += CUDA_EXACT_FLAGS
    build_dir.mkdir(parents=True, exist_ok=True)
    objects = [build_dir / (p.stem + ("_cu" if p.suffix == ".cu" else "") + ".o") for p in cuda_sources()]

    def compile_one(pair):
        src, obj = pair
        if src.suffix == ".cu":
            _run([nvcc, *common, *gencode, "-Xfatbin=-compress-all", "-c", str(src), "-o", str(obj)])
        else:  # host code: the C ABI, which records the architectures
            _run([nvcc, *common, f'-DSPLAT_CUDA_ARCH_LIST="{listed}"', "-c", str(src), "-o", str(obj)])

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, zip(cuda_sources(), objects)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    link = ["-shared", "-cudart=static", "-Xlinker=--exclude-libs=ALL,-s", "-o", str(tmp)]
    _run([nvcc, *[str(o) for o in objects], *link])
    os.replace(tmp, out)
    return out


# The C++ compiler of each platform.  The kernels use GCC/Clang vector
# extensions (kernels/cpu/simd.h), so MSVC cannot build them: Windows uses
# LLVM's clang++.  Only the Linux build has run; the others compile the same
# sources (scripts/cross_compile_check.sh) but have not been linked or run.
DEFAULT_CXX = {"linux": "g++", "darwin": "clang++", "win32": "clang++"}


def _openmp_flags(platform: str) -> tuple[list[str], list[str]]:
    """OpenMP's compile and link flags.  GCC and LLVM's clang take -fopenmp;
    Apple's clang has no OpenMP runtime of its own and takes Homebrew's libomp
    ($SPLAT_OPENMP_PREFIX, else `brew --prefix libomp`).  Without one the
    library is built serial (kernels/cpu/tiles.h), and says so."""
    if platform != "darwin":
        return ["-fopenmp"], ["-fopenmp"]
    prefix = os.environ.get("SPLAT_OPENMP_PREFIX")
    if not prefix:
        try:
            prefix = subprocess.run(["brew", "--prefix", "libomp"], capture_output=True, text=True).stdout.strip()
        except OSError:
            prefix = ""
    if prefix and (Path(prefix) / "include" / "omp.h").is_file():
        return ["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"], [f"-L{prefix}/lib", "-lomp"]
    print(
        "splat: no libomp (brew install libomp, or set SPLAT_OPENMP_PREFIX): the CPU kernels are built for one thread",
        file=sys.stderr,
    )
    return [], []


def toolchain(platform: str = sys.platform) -> tuple[list[str], list[str], list[str]]:
    """(compiler command, compile flags, link flags) of the CPU library on
    ``platform``.  $CXX may hold a launcher too ("ccache g++")."""
    flags = runpy.run_path(str(Path(__file__).resolve().parent / "_compile_flags.py"))
    cxx = shlex.split(os.environ.get("CXX", "")) or [DEFAULT_CXX.get(platform, "c++")]
    omp_compile, omp_link = _openmp_flags(platform)
    cflags = [f for f in flags["CXX_FLAGS"] if f != "-fopenmp"] + omp_compile
    lflags = [f for f in flags["LINK_FLAGS"] if f != "-fopenmp"] + omp_link
    # -DNDEBUG -fwrapv -O3: what Python's sysconfig added to the torch extension
    # build, so that the code generated is that of today's splat._C.
    if platform == "win32":  # PE: every symbol is hidden unless SPLAT_API exports it
        return cxx, ["-DNDEBUG", "-fwrapv", *cflags], lflags
    if platform == "darwin":
        lflags = [*lflags, f"-Wl,-install_name,@rpath/{CPU_LIBRARY['darwin']}"]
    return cxx, ["-DNDEBUG", "-fwrapv", "-fPIC", "-fvisibility=hidden", *cflags], lflags


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"splat: the compiler '{command[0]}' was not found (install it, or set CXX/NVCC)") from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")


def build_cpu_library(out: Path, build_dir: Path, jobs: int | None = None) -> Path:
    """Compiles cpu_sources() into the shared library `out` (objects in build_dir)."""
    cxx, cflags, lflags = toolchain()
    build_dir.mkdir(parents=True, exist_ok=True)
    objects = [build_dir / (p.stem + ".o") for p in cpu_sources()]

    def compile_one(pair):
        src, obj = pair
        _run([*cxx, *cflags, f"-I{KERNELS}", "-c", str(src), "-o", str(obj)])

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, zip(cpu_sources(), objects)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    _run([*cxx, "-shared", *[str(o) for o in objects], *lflags, "-o", str(tmp)])
    os.replace(tmp, out)  # atomic: a concurrent loader never sees half a file
    return out


if __name__ == "__main__":
    # python splat/_native_build.py [cpu|cuda] [OUT]  (cuda: $SPLAT_CUDA_ARCHS, default all)
    args = sys.argv[1:]
    kind = args.pop(0) if args and args[0] in ("cpu", "cuda") else "cpu"
    target = Path(args[0]) if args else KERNELS.parent / library_name(kind)
    if kind == "cuda":
        archs = os.environ.get("SPLAT_CUDA_ARCHS", "all")
        print(build_cuda_library(target, target.parent / "build_native" / "cuda", archs))
    else:
        print(build_cpu_library(target, target.parent / "build_native"))
