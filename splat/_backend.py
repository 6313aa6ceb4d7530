"""Finds the compiled kernels: the installed extension ``splat._C``, or a JIT
build with ninja (torch.utils.cpp_extension.load) when it is not installed."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from splat._compile_flags import CXX_FLAGS, LINK_FLAGS

_KERNELS = Path(__file__).resolve().parent / "kernels"


@cache
def load_extension():
    """Returns the kernel module, building it just in time if needed.

    Raises ImportError with the reason when neither works.
    """
    try:
        from splat import _C  # type: ignore[attr-defined]

        return _C
    except ImportError as installed_error:
        if os.environ.get("SPLAT_NO_JIT") == "1":
            raise ImportError(f"splat._C is not built and SPLAT_NO_JIT=1: {installed_error}") from None
    from torch.utils.cpp_extension import load

    # Every CPU source, as setup.py.
    sources = [str(_KERNELS / "bindings.cpp")] + sorted(str(p) for p in (_KERNELS / "cpu").glob("*.cpp"))
    try:
        return load(
            name="splat_C_jit",
            sources=sources,
            extra_include_paths=[str(_KERNELS)],
            extra_cflags=CXX_FLAGS,
            extra_ldflags=LINK_FLAGS,
            verbose=False,
        )
    except Exception as error:  # compiler missing, ninja missing, ...
        raise ImportError(
            "splat's compiled kernels are unavailable: not installed (pip install -e . "
            f"--no-build-isolation) and the JIT build failed: {error}"
        ) from error


def has_extension() -> bool:
    try:
        load_extension()
        return True
    except ImportError:
        return False


def has_cuda_kernels() -> bool:
    return has_extension() and bool(getattr(load_extension(), "with_cuda", False))
