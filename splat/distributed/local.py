"""N local processes joined by gloo, started as torchrun would start them
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment), each
running one function; what each returns comes back to the caller.  For the
tests and benchmarks of splat.distributed on one machine; training itself
is started by torchrun."""

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


def _entry(fn, rank, world, port, out_dir, threads, args):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(threads)
    from .group import from_environment, leave

    group = from_environment("cpu", timeout_s=60)
    try:
        result = fn(group, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        leave(group, synchronize=False)
        raise
    leave(group)


def run_ranks(fn, world: int, out_dir, *args, timeout_s: float = 180.0, threads: int = 1) -> list:
    """``fn(group, *args)`` on ``world`` processes of ``threads`` torch
    threads each; returns their results in rank order (saved with
    torch.save in ``out_dir``).  ``fn`` must be importable (a module-level
    function).  Any rank's failure (or the timeout) raises with its
    traceback; no process is left behind."""
    ctx = mp.get_context("spawn")
    port = free_port()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in range(world):  # a previous call's results must not pass for this one's
        for suffix in (".pt", ".err"):
            (out_dir / f"rank{r}{suffix}").unlink(missing_ok=True)
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, str(out_dir), threads, args)) for r in range(world)]
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
            raise RuntimeError(f"rank {r} failed:\n{e.read_text()}")
    codes = [p.exitcode for p in procs]
    if codes != [0] * world:
        raise RuntimeError(f"exit codes {codes} (a rank hung past {timeout_s} s or crashed)")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
