"""Builds splat and its compiled kernels, splat._C.

The C++ CPU backend is always built.  The CUDA backend is added when the
installed torch is a CUDA build and nvcc is found (or SPLAT_BUILD_CUDA=1 forces
it, SPLAT_BUILD_CUDA=0 disables it).

Install with torch already present and without build isolation, so that pip
does not fetch a different torch into a temporary build environment:

    pip install torch==2.13.0
    pip install -e . --no-build-isolation
"""

import glob
import os
import runpy
import shutil

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("splat", "kernels")


def _want_cuda() -> bool:
    forced = os.environ.get("SPLAT_BUILD_CUDA")
    if forced is not None:
        return forced == "1"
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and (CUDA_HOME is not None or shutil.which("nvcc"))


def _extensions():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    # Every CPU source (splat/_backend.py's JIT build globs the same).
    sources = [os.path.join(KERNELS, "bindings.cpp")] + sorted(glob.glob(os.path.join(KERNELS, "cpu", "*.cpp")))
    # The flags (and why) live in splat/_compile_flags.py, shared with the JIT
    # build; read without importing splat, which needs the built extension.
    flags = runpy.run_path(os.path.join(HERE, "splat", "_compile_flags.py"))
    cxx, link = flags["CXX_FLAGS"], flags["LINK_FLAGS"]
    include_dirs = [os.path.join(HERE, KERNELS)]
    if _want_cuda():
        sources += sorted(glob.glob(os.path.join(KERNELS, "cuda", "*.cu")))
        sources += sorted(glob.glob(os.path.join(KERNELS, "cuda", "*.cpp")))
        # No FMA contraction and IEEE division/sqrt: the CUDA kernels then round
        # like the CPU build of the same core.h (see scripts/compile_cuda_check.sh).
        nvcc = [
            "-O3",
            "-std=c++17",
            "-DSPLAT_WITH_CUDA",
            "--fmad=false",
            "-ftz=false",
            "-prec-div=true",
            "-prec-sqrt=true",
        ]
        return [
            CUDAExtension(
                "splat._C",
                sources,
                include_dirs=include_dirs,
                extra_compile_args={"cxx": cxx + ["-DSPLAT_WITH_CUDA"], "nvcc": nvcc},
                extra_link_args=link,
            )
        ]
    return [
        CppExtension(
            "splat._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
        )
    ]


def _docs_requirements():
    path = os.path.join(HERE, "docs", "requirements.txt")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def _build_ext():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)


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
            *_MESH,
        ],
        "mesh": _MESH,
        "sfm": ["pycolmap"],
        "viewer": ["viser"],
        # The documentation site (mkdocs build --strict); the list lives in
        # docs/requirements.txt so that CI installs it without rebuilding splat.
        "docs": _docs_requirements(),
    },
    ext_modules=_extensions(),
    cmdclass={"build_ext": _build_ext()},
)
