"""Joining and leaving the process group (splat.distributed.group, issue 23).

A rank that has left the group must hold none of it: gloo's worker threads
that outlive :func:`splat.distributed.leave` are torn down with the
interpreter at exit, and one still releasing a collective's tensors then
aborts the process after a successful run ("terminate called without an
active exception", a flaky CI failure until its cause was found: see
``splat.distributed.group._import_modules_that_capture_the_group``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from splat.distributed.local import run_ranks

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def _thread_names() -> list[str]:
    task = Path("/proc/self/task")
    return sorted((task / t / "comm").read_text().strip() for t in os.listdir(task))


def train_a_step_and_leave(group):
    """What a training rank does at its start and end: an optimizer (the
    first one makes torch import its compiler, and with it
    torch.distributed.nn), a collective, then leave()."""
    import torch.distributed as dist
    from torch.distributed.nn import functional

    from splat.distributed import leave

    param = torch.nn.Parameter(torch.ones(4))
    torch.optim.Adam([param], lr=0.1, foreach=True)
    total = torch.ones(3)
    dist.all_reduce(total)
    captured = [
        name
        for name, f in vars(functional).items()
        if any(isinstance(d, dist.ProcessGroup) for d in (getattr(f, "__defaults__", None) or ()))
    ]
    during = _thread_names()
    leave(group)
    return {"sum": total.tolist(), "captured": captured, "during": during, "after": _thread_names()}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from /proc")
def test_leave_ends_the_group_and_its_threads(tmp_path):
    for result in run_ranks(train_a_step_and_leave, 2, tmp_path):
        assert result["sum"] == [2.0, 2.0, 2.0]
        assert any(name in result["during"] for name in GLOO_THREADS)  # the check below can see them
        # No function keeps the group as a default argument, so nothing holds it ...
        assert result["captured"] == []
        # ... and destroy_process_group really ended it: its threads are gone.
        assert not any(name in result["after"] for name in GLOO_THREADS), result["after"]
