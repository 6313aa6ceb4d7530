"""Fixtures shared by several test files."""

import pytest
import torch


@pytest.fixture()
def one_thread():
    """Tiny images: one thread avoids OpenMP's start-up cost per call, which
    dominates on a busy machine (finite differences make hundreds of calls)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
