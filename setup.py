"""Builds splat and its compiled kernels.

The CPU kernels are always built, into splat/libsplat_cpu.so: a plain C
library (splat/kernels/splat_api.h) compiled with the system C++
compiler ($CXX, default g++) and loaded with ctypes, so it needs neither torch
nor Python headers and one build serves every torch and CPython
(splat/_native_build.py has the commands).

The CUDA kernels come in two forms, which run the same C ABI and host call
sequence (splat/kernels/splat_cuda_api.h, cuda/host_sequence.h):
  * splat/libsplat_cuda.so, a plain C library built with nvcc (CUDA runtime
    linked statically, no torch) when SPLAT_CUDA_ARCHS names architectures
    ("all": the wheel's seven with PTX of the newest; "86", "8.9;12.0+PTX",
    ...) and nvcc is found; scripts/build_wheels.sh puts it in the wheel;
  * the torch extension splat._C of a source install on a CUDA torch: added
    when the installed torch is a CUDA build and nvcc is found (or
    SPLAT_BUILD_CUDA=1 forces it, SPLAT_BUILD_CUDA=0 disables it); built by
    torch for the local GPU (TORCH_CUDA_ARCH_LIST), and what the GPU campaign
    rebuilds with SPLAT_CUDA_EXACT=0.
splat/_native_cuda.py loads the library when present, else the extension.

The CUDA kernels are built exact by default: no fused multiply-add
(--fmad=false), no flush of denormals to zero and IEEE division and square
root, so that they round like the CPU library.  SPLAT_CUDA_EXACT=0 drops
those four flags (nvcc's fast defaults); the GPU campaign's fastmath stage
measures what that gains and how far such a build strays from the CPU.

Install with torch already present and without build isolation, so that pip
does not fetch a different torch into a temporary build environment:

    pip install torch==2.13.0
    pip install -e . --no-build-isolation
"""

import glob
import os
import runpy
import shutil
from pathlib import Path

from setuptools import Extension, find_packages, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's, if any
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel to tag: an editable or develop install
        bdist_wheel = None
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("splat", "kernels")
# The C libraries' build (read without importing splat, which needs torch).
_NATIVE = runpy.run_path(os.path.join(HERE, "splat", "_native_build.py"))
# nvcc's flags for kernels that round like the CPU library (SPLAT_CUDA_EXACT).
CUDA_EXACT_FLAGS = list(_NATIVE["CUDA_EXACT_FLAGS"])


def _want_cuda() -> bool:
    forced = os.environ.get("SPLAT_BUILD_CUDA")
    if forced is not None:
        return forced == "1"
    try:
        import torch
    except ImportError:  # the CPU library needs no torch to build
        return False
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and (CUDA_HOME is not None or shutil.which("nvcc"))


# The CPU library, as an extension whose build is ours (_BuildExt): setuptools
# then puts it in place for editable installs and into wheels like any
# extension, but its file is splat/libsplat_cpu.so, no Python module.
_CPU_LIBRARY = Extension("splat.libsplat_cpu", sources=[])
# The same for the CUDA library, when SPLAT_CUDA_ARCHS asks for it.
_CUDA_LIBRARY = Extension("splat.libsplat_cuda", sources=[])
_LIBRARIES = {_CPU_LIBRARY.name: "cpu", _CUDA_LIBRARY.name: "cuda"}


def _cuda_archs() -> str | None:
    """SPLAT_CUDA_ARCHS when it asks for the CUDA library and nvcc is there."""
    archs = os.environ.get("SPLAT_CUDA_ARCHS", "").strip()
    if archs in ("", "0", "none"):
        return None
    if shutil.which(os.environ.get("NVCC", "nvcc")) is None:
        raise SystemExit(f"SPLAT_CUDA_ARCHS={archs} asks for the CUDA library, but nvcc is not on the PATH (or $NVCC)")
    return archs


def _libraries():
    return [_CPU_LIBRARY] + ([_CUDA_LIBRARY] if _cuda_archs() else [])


def _extensions():
    if not _want_cuda():
        return _libraries()
    from torch.utils.cpp_extension import CUDAExtension

    # The CUDA kernels, with the torch bindings (bindings.cpp and the CPU
    # sources it registers).  The flags (and why) live in
    # splat/_compile_flags.py; read without importing splat.
    sources = [os.path.join(KERNELS, "bindings.cpp")] + sorted(glob.glob(os.path.join(KERNELS, "cpu", "*.cpp")))
    flags = runpy.run_path(os.path.join(HERE, "splat", "_compile_flags.py"))
    cxx, link = flags["CXX_FLAGS"], flags["LINK_FLAGS"]
    include_dirs = [os.path.join(HERE, KERNELS)]
    sources += sorted(glob.glob(os.path.join(KERNELS, "cuda", "*.cu")))
    sources += sorted(glob.glob(os.path.join(KERNELS, "cuda", "*.cpp")))
    # The C ABI of the CUDA kernels, which bindings_cuda.cpp calls: the one host
    # call sequence of libsplat_cuda.so and the CUDA emulation tests.
    sources.append(os.path.join(KERNELS, "capi_cuda.cpp"))
    # No FMA contraction and IEEE division/sqrt: the CUDA kernels then round
    # like the CPU build of the same core.h (see scripts/compile_cuda_check.sh).
    # SPLAT_CUDA_EXACT=0 leaves nvcc's fast defaults (the docstring above).
    nvcc = ["-O3", "-std=c++17", "-DSPLAT_WITH_CUDA"]
    if os.environ.get("SPLAT_CUDA_EXACT", "1") != "0":
        nvcc += CUDA_EXACT_FLAGS
    return [
        *_libraries(),
        CUDAExtension(
            "splat._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx + ["-DSPLAT_WITH_CUDA"], "nvcc": nvcc},
            extra_link_args=link,
        ),
    ]


def _requirements(relative):
    path = os.path.join(HERE, relative)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def _build_ext():
    """build_ext that builds the C libraries with splat/_native_build.py (and
    any torch extension as torch builds it)."""
    native = _NATIVE
    base = build_ext
    if _want_cuda():
        from torch.utils.cpp_extension import BuildExtension

        base = BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)

    class _BuildExt(base):
        def get_ext_filename(self, fullname):
            # asked with the full name and with its last part (get_ext_fullpath)
            for name, kind in _LIBRARIES.items():
                if fullname in (name, name.split(".")[-1]):
                    return os.path.join(*fullname.split(".")[:-1], native["library_name"](kind))
            return super().get_ext_filename(fullname)

        def build_extension(self, ext):
            kind = _LIBRARIES.get(ext.name)
            if kind is None:
                return super().build_extension(ext)
            out = Path(os.path.abspath(self.get_ext_fullpath(ext.name)))
            objects = Path(os.path.abspath(self.build_temp)) / f"splat_{kind}"
            if kind == "cpu":
                native["build_cpu_library"](out, objects, self.parallel or None)
            else:
                native["build_cuda_library"](out, objects, _cuda_archs(), self.parallel or None)

    return _BuildExt


class _PlatformWheel(bdist_wheel or object):
    """A py3-none-<platform> wheel: it holds C libraries loaded with ctypes but
    no Python extension module, so it fits every CPython 3 and every torch."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


# open3d's CPU-only wheel where it exists (Linux x86_64): splat renders on its
# own and open3d only fuses and cleans meshes, so the CUDA build's extra size
# buys nothing.  0.20 for the tensor VoxelBlockGrid and create_isosurfaces.
_MESH = [
    "open3d-cpu>=0.20; platform_system == 'Linux' and platform_machine == 'x86_64'",
    "open3d>=0.20; platform_system != 'Linux' or platform_machine != 'x86_64'",
]

setup(
    name="splat",
    version="0.1.0",
    description="Differentiable 2D Gaussian surfel rasterizer with exact depth-distortion gradients",
    packages=find_packages(include=["splat", "splat.*"]),
    # configs/*.yaml: the packaged configs (`splat train --config fast` outside a checkout).
    package_data={"splat": ["kernels/*.h", "kernels/*.cpp", "kernels/cpu/*", "kernels/cuda/*", "configs/*.yaml"]},
    # The `splat` command (splat/cli.py): splat train|render|view|convert.
    entry_points={"console_scripts": ["splat = splat.cli:main"]},
    python_requires=">=3.10",
    # torch is deliberately not listed: any torch requirement lets pip replace the
    # installed build with the newest one.  Install torch first (see README).
    # opencv-python-headless: lens undistortion at load (most real captures are distorted).
    # scipy: k-d tree for the initial scales of large point clouds.
    install_requires=["numpy", "scipy", "plyfile>=1.0", "tqdm", "pyyaml", "pillow", "opencv-python-headless"],
    extras_require={
        # The test extra pulls every optional part the suite exercises, so CI
        # tests them all: pycolmap (convert.py, triangulation), viser and
        # playwright (the viewer, driven in the system Chromium), gsplat 1.5.0
        # (its pure-Python DefaultStrategy reads splat.compat.gsplat's meta; its
        # CUDA code is compiled only on first use, which the tests never make)
        # and open3d (the mesh tests fuse real meshes); ruff and clang-format,
        # pinned, for scripts/lint.sh (CI checks formatting with them).
        "test": [
            "pytest",
            "hypothesis",
            "pycolmap",
            "viser",
            "playwright",
            "gsplat==1.5.0",
            "ruff==0.17.6",
            "clang-format==23.1.5",
            # .github/workflows/wheels.yml's syntax (tests/test_wheels_workflow.py)
            "check-jsonschema==0.39.0",
            *_MESH,
        ],
        # scripts/build_wheels.sh (the list lives in scripts/wheel-requirements.txt,
        # which CI installs without rebuilding splat).
        "wheel": _requirements(os.path.join("scripts", "wheel-requirements.txt")),
        "mesh": _MESH,
        "sfm": ["pycolmap"],
        "viewer": ["viser"],
        # The documentation site (mkdocs build --strict); the list lives in
        # docs/requirements.txt so that CI installs it without rebuilding splat.
        "docs": _requirements(os.path.join("docs", "requirements.txt")),
    },
    ext_modules=_extensions(),
    cmdclass={"build_ext": _build_ext(), **({"bdist_wheel": _PlatformWheel} if bdist_wheel else {})},
)
