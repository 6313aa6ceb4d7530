"""Runs a function on N local processes joined by gloo, as torchrun would
start them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment), and collects what each rank returns."""
from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, port, out_dir, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from splat.distributed import from_environment, leave

    group = from_environment("cpu", timeout_s=60)
    try:
        result = fn(group, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        leave(group)


def run_ranks(fn, world: int, out_dir, *args, timeout_s: float = 180.0) -> list:
    """``fn(group, *args)`` on ``world`` processes; returns their results in
    rank order.  ``fn`` must be importable (a module-level function).  Any
    rank's failure (or the timeout) fails with its traceback; no process is
    left behind."""
    ctx = mp.get_context("spawn")
    port = free_port()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, str(out_dir), args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    errors = [(r, out_dir / f"rank{r}.err") for r in range(world)]
    for r, e in errors:
        if e.exists():
            raise AssertionError(f"rank {r} failed:\n{e.read_text()}")
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"exit codes {codes} (a rank hung past {timeout_s} s or crashed)"
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
