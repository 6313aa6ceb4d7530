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
import time
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


# ------------------------------------------------------------ the rendezvous
ROOT = Path(__file__).resolve().parents[1]


def _start_alone(rank: int, port: int, timeout_s: float, out: Path):
    """train.py as rank ``rank`` of WORLD_SIZE=2, started by hand, with no peer."""
    import subprocess
    import sys

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    for key in ("TORCHELASTIC_USE_AGENT_STORE", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    cmd = [sys.executable, str(ROOT / "train.py"), "--data", str(ROOT / "data" / "sample_scene"), "--out", str(out)]
    cmd += ["--iterations", "5", "--no-progress", f"distributed.timeout_s={timeout_s}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_peer_that_never_starts_is_waited_for_timeout_s(tmp_path):
    """WORLD_SIZE=2 with only one rank started: rank 0 (which hosts the
    store) names the missing rank 1, and a lone rank 1 names rank 0, within
    distributed.timeout_s (not torch's 30 minutes), in one line each."""
    from splat.distributed.local import free_port

    timeout_s = 5
    started = time.monotonic()
    procs = {r: _start_alone(r, free_port(), timeout_s, tmp_path / f"out{r}") for r in (0, 1)}
    try:
        errs = {r: p.communicate(timeout=timeout_s + 90)[1] for r, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - started
    assert elapsed < timeout_s + 60, f"took {elapsed:.0f} s"  # the imports take seconds on a loaded machine
    for r, p in procs.items():
        assert p.returncode == 1, errs[r][-2000:]
        assert "Traceback" not in errs[r] and len(errs[r].strip().splitlines()) == 1, errs[r][-2000:]
    assert errs[0].startswith(f"error: rank 0 waited {timeout_s} s (distributed.timeout_s) for rank 1 of WORLD_SIZE=2")
    assert errs[1].startswith(f"error: rank 1 waited {timeout_s} s for rank 0 at 127.0.0.1:")
    assert "distributed.timeout_s" in errs[1]


def test_sigterm_stops_a_rank_waiting_for_its_peers(tmp_path):
    """SIGTERM while rank 0 waits for a peer that never comes: one line and
    exit code 143 at once (torch's own rendezvous waited in C++, where no
    Python signal handler runs)."""
    import signal
    import socket

    from splat.distributed.local import free_port

    port = free_port()
    proc = _start_alone(0, port, 120, tmp_path / "out")
    try:
        deadline = time.monotonic() + 90
        while True:  # rank 0 is waiting once it hosts the store
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "rank 0 never hosted the store"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert err.strip() == "error: terminated (SIGTERM)", err[-2000:]
    assert stopped_after < 15, f"took {stopped_after:.0f} s"
