"""The compute device of a run and its memory figure (shared by the trainer,
the viewer and the process-group setup of splat.distributed)."""

from __future__ import annotations

import resource
import sys

import torch

from .errors import ConfigError


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA allocation on GPU, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cuda`` without a GPU is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name}: no CUDA GPU is available (torch {torch.__version__}); use device=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device={name}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev
