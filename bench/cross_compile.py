"""Builds the CPU library for the platforms this machine cannot run: Linux
aarch64, macOS arm64 and Windows x86_64 (plus Linux x86_64 with clang), with
``zig c++`` (clang and each target's C library headers in one pip package,
``pip install ziglang``), from the same sources and flags as the real build
(:func:`splat._native_build.toolchain` for each platform).  Prints JSON.

    python bench/cross_compile.py --out bench/results/cross_compile.json
    python bench/cross_compile.py --no-clones-lib TREE/splat/libsplat_cpu.so

What it proves: every kernel source compiles and links on each target with
clang, and the library exports exactly the ``splat_*`` functions of
``kernels/splat_api.h``.  What it does not: zig ships no OpenMP header, so
these builds are serial (the ``_OPENMP`` fallbacks), and none of them runs
here (no aarch64, macOS or Windows machine).

``--no-clones-lib`` builds this machine's library with g++ and
``-DSPLAT_NO_CLONES`` (kernels/cpu/dispatch.h: the path of every platform
without GCC's run-time dispatch) into a built copy of the tree, so that
``bench/bitwise_kernels.py --roots . COPY`` can compare it bitwise with the
dispatched build.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

from splat._native_build import KERNELS, cpu_sources, toolchain  # noqa: E402

# zig target -> the sys.platform whose flags it builds with, and the library's file name
TARGETS = {
    "x86_64-linux-gnu": ("linux", "libsplat_cpu.so"),
    "aarch64-linux-gnu": ("linux", "libsplat_cpu.so"),
    "aarch64-macos": ("darwin", "libsplat_cpu.dylib"),
    "x86_64-windows-gnu": ("win32", "splat_cpu.dll"),
}
OPENMP = ("-fopenmp", "-Xpreprocessor", "-lomp")


def api_functions() -> list[str]:
    """The functions kernels/splat_api.h declares."""
    text = (KERNELS / "splat_api.h").read_text()
    return sorted(set(re.findall(r"SPLAT_API\s+[\w\s\*]+?\b(splat_\w+)\s*\(", text)))


def zig_command(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        sys.exit("cross_compile: needs zig (pip install ziglang, or --zig PATH)")
    return [sys.executable, "-m", "ziglang"]


def exported(library: Path, platform: str) -> list[str] | None:
    """The library's exported splat_* symbols (None where no tool here reads the format)."""
    if platform == "linux" and shutil.which("readelf"):
        text = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True).stdout
        return sorted({f.split()[-1] for f in text.splitlines() if " GLOBAL " in f and " UND " not in f})
    if platform == "win32" and shutil.which("objdump"):
        text = subprocess.run(["objdump", "-p", str(library)], capture_output=True, text=True).stdout
        table = text.split("[Ordinal/Name Pointer] Table")[-1]
        return sorted(set(re.findall(r"\]\s+(splat_\w+)", table)))
    return None


def build(zig: list[str], target: str, work: Path) -> dict:
    platform, name = TARGETS[target]
    cxx, cflags, lflags = toolchain(platform)
    cflags = [f for f in cflags if f not in OPENMP and not f.startswith("-I")]
    lflags = [f for f in lflags if f not in OPENMP and not f.startswith(("-L", "-Wl,-install_name"))]
    out = work / target
    out.mkdir()
    objects = []
    for src in cpu_sources():
        obj = out / (src.stem + ".o")
        done = subprocess.run(
            [*zig, "c++", "-target", target, *cflags, f"-I{KERNELS}", "-c", str(src), "-o", str(obj)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return {"ok": False, "failed": src.name, "stderr": done.stderr[-2000:]}
        objects.append(str(obj))
    library = out / name
    done = subprocess.run(
        [*zig, "c++", "-target", target, "-shared", *objects, *lflags, "-o", str(library)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"ok": False, "failed": "link", "stderr": done.stderr[-2000:]}
    symbols = exported(library, platform)
    return {
        "ok": True,
        "flags_of": platform,
        "compile_flags": cflags,
        "bytes": library.stat().st_size,
        "exports": "not inspected (no tool here reads this format)" if symbols is None else symbols,
        "exports_match_api": None
        if symbols is None
        else [s for s in symbols if s.startswith("splat_")] == symbols and symbols == api_functions(),
    }


def no_clones_tree(tree: Path) -> dict:
    """Copies the tracked sources to ``tree`` and builds its library with -DSPLAT_NO_CLONES."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (tree / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, tree / f)
    cxx, cflags, lflags = toolchain()
    objects = []
    with tempfile.TemporaryDirectory() as tmp:
        for src in cpu_sources():
            obj = Path(tmp) / (src.stem + ".o")
            subprocess.run(
                [*cxx, *cflags, "-DSPLAT_NO_CLONES", f"-I{KERNELS}", "-c", str(src), "-o", str(obj)], check=True
            )
            objects.append(str(obj))
        library = tree / "splat" / "libsplat_cpu.so"
        subprocess.run([*cxx, "-shared", *objects, *lflags, "-o", str(library)], check=True)
    clones = subprocess.run(["nm", str(library)], capture_output=True, text=True).stdout.count(".avx2")
    return {"tree": str(tree), "avx2_clones_in_library": clones}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zig", help="the zig executable (default: python -m ziglang)")
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--no-clones-tree", type=Path, help="build a -DSPLAT_NO_CLONES copy of the tree there instead")
    p.add_argument("--out")
    args = p.parse_args()
    if args.no_clones_tree:
        emit(no_clones_tree(args.no_clones_tree.resolve()), args.out)
        return
    zig = zig_command(args.zig)
    version = subprocess.run([*zig, "version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        results = {t: build(zig, t, Path(tmp)) for t in args.targets}
    emit(
        {
            "benchmark": "cross_compile",
            "commit": commit(str(ROOT)),
            "machine": machine(),
            "command": "python " + " ".join(["bench/cross_compile.py", *sys.argv[1:]]),
            "zig": version,
            "api_functions": len(api_functions()),
            "targets": results,
            "untested": "OpenMP on these targets (zig ships no omp.h: serial builds), and running any of them",
        },
        args.out,
    )
    if not all(r["ok"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
