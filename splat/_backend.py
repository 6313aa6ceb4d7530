"""Finds the compiled kernels: the C libraries beside the package, loaded with
ctypes by splat/_native.py (built just in time with the system compiler when
missing)."""

from __future__ import annotations


def load_extension():
    """Returns the kernel operations (splat._native.CpuKernels).

    Raises ImportError with the reason when they are unavailable.
    """
    from splat._native import kernels

    return kernels()


def has_extension() -> bool:
    try:
        load_extension()
        return True
    except ImportError:
        return False


def has_cuda_kernels() -> bool:
    return has_extension() and bool(getattr(load_extension(), "with_cuda", False))
