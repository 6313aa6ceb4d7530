"""Which process this is, and the torch.distributed process group.

torchrun (``torchrun --standalone --nproc_per_node=N train.py ...``, or
``--nnodes ... --rdzv_endpoint ...`` across machines) starts N copies of the
program with RANK, WORLD_SIZE and LOCAL_RANK set; :func:`from_environment`
reads them and joins the group through torch.distributed's ``env://``
rendezvous.  Without torchrun (no WORLD_SIZE, or WORLD_SIZE=1) it joins
nothing and returns the one-process :class:`Group`, so the trainer runs one
code path for one process or N.

Backend: NCCL when each rank has a GPU of its own (LOCAL_RANK picks it),
gloo otherwise, so CPU clusters and the tests here run the same code.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch

from ..errors import ConfigError, RunStateError

#: Default seconds a collective may wait for a peer before the rank gives up
#: (a peer that died): ``distributed.timeout_s`` in the config.
DEFAULT_TIMEOUT_S = 120.0
#: Seconds a collective waits for a live but slow peer before it fails.
COLLECTIVE_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Group:
    """This process's place in the run: ``rank`` of ``world_size``
    (``local_rank`` on its machine), the torch.distributed ``backend``
    ("nccl", "gloo", or None for one process) and the ``device`` it
    computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, logs and writes the shared outputs."""
        return self.rank == 0


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"environment variable {name} is not set (start the processes with torchrun)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def launched_ranks() -> int:
    """WORLD_SIZE as set by torchrun, 1 when the program was started directly."""
    return _env_int("WORLD_SIZE", 1)


def from_environment(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> Group:
    """The group torchrun started this process in, joined; the one-process
    group when there is none.

    ``device``: the config's ``device`` ("auto", "cpu", "cuda" or
    "cuda:K").  With more than one rank, "auto" and "cuda" give rank r the
    GPU LOCAL_RANK and NCCL when there are enough GPUs, else the CPU and
    gloo; an explicit "cuda:K" is refused (every rank would share GPU K).
    ``timeout_s``: how long a silent peer is waited for (the watchdog's
    bound); a collective itself waits at least :data:`COLLECTIVE_TIMEOUT_S`
    for a peer that is alive but slow."""
    world = launched_ranks()
    if world <= 1:
        from ..devices import resolve_device

        return Group(device=resolve_device(device))
    rank, local_rank = _env_int("RANK"), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world:
        raise ConfigError(f"environment variable RANK={rank} is outside [0, WORLD_SIZE={world})")
    if device.startswith("cuda:"):
        raise ConfigError(
            f"device={device}: with several processes each rank takes the GPU LOCAL_RANK; "
            "use device=auto or device=cuda"
        )
    if timeout_s <= 0:
        raise ConfigError(f"distributed.timeout_s={timeout_s} must be > 0")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # Every rank must pick the same backend: NCCL only when every process on
    # this machine (torchrun's LOCAL_WORLD_SIZE) has a GPU of its own.
    local_world = _env_int("LOCAL_WORLD_SIZE", local_rank + 1)
    if device in ("auto", "cuda") and local_world <= gpus:
        backend, dev = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    elif device == "cuda":
        raise ConfigError(
            f"device=cuda: {local_world} processes on this machine but {gpus} GPU(s) visible; "
            "start at most one process per GPU (--nproc_per_node)"
        )
    else:
        backend, dev = "gloo", torch.device("cpu")
    import torch.distributed as dist

    if not dist.is_initialized():
        _import_modules_that_capture_the_group()
        # A collective may wait this long for a slow peer (rank 0 builds the
        # initial model alone: a minute on a large scene).  A dead peer is
        # the watchdog's job, within timeout_s (splat.distributed.watchdog).
        wait = max(timeout_s, COLLECTIVE_TIMEOUT_S)
        store = _rendezvous(rank, world, timeout_s)
        store.set_timeout(datetime.timedelta(seconds=wait))
        # The key prefix init_process_group gives a store it creates itself.
        store = dist.PrefixStore("default_pg", store)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=wait)
        )
    return Group(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=dev)


#: Seconds of one wait inside torch (a connection attempt) during the
#: rendezvous: signal handlers run only between them.
_POLL_S = 0.2


def _rendezvous(rank: int, world: int, timeout_s: float):
    """The rendezvous store (torch.distributed's ``env://``), once every rank
    has joined it; RunStateError naming the missing ranks after ``timeout_s``.

    torch's own rendezvous waits inside C++ for the store's timeout (30
    minutes by default) for a peer that never starts, and Python signal
    handlers cannot run meanwhile: SIGTERM and Ctrl+C did nothing.  Here
    every wait is a short one in Python: a client probes the store's port
    with a plain socket (a refused TCPStore connection logs a native stack
    on every retry) before it connects, and then each rank registers and
    polls for the others."""
    import time

    import torch.distributed as dist

    addr = os.environ.get("MASTER_ADDR")
    if not addr:
        raise ConfigError("environment variable MASTER_ADDR is not set (start the processes with torchrun)")
    port = _env_int("MASTER_PORT")
    if not 0 < port < 2**16:
        raise ConfigError(f"environment variable MASTER_PORT={port} is not a port number")
    deadline = time.monotonic() + timeout_s
    op_timeout = datetime.timedelta(seconds=max(timeout_s, 1.0))
    at = f"{addr}:{port}"
    hint = "start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or raise distributed.timeout_s"
    # torchrun's agent hosts the store (every worker is a client); started
    # without torchrun, rank 0 hosts it.
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    if hosts:
        try:
            store = dist.TCPStore(addr, port, None, True, timeout=op_timeout, wait_for_workers=False, multi_tenant=True)
        except dist.DistError as e:
            why = "address in use" if "EADDRINUSE" in str(e) else str(e).splitlines()[0]
            raise ConfigError(f"MASTER_PORT={port}: rank 0 cannot host the rendezvous at {at} ({why})") from None
    else:
        import socket

        host = "rank 0" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" else "torchrun's agent"
        while True:
            try:
                socket.create_connection((addr, port), timeout=_POLL_S).close()
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise RunStateError(
                        f"rank {rank} waited {timeout_s:g} s for {host} at {at} (MASTER_ADDR:MASTER_PORT), "
                        f"which never answered: {hint}"
                    ) from None
                time.sleep(_POLL_S)
        try:
            store = dist.TCPStore(addr, port, None, False, timeout=op_timeout, wait_for_workers=False)
        except dist.DistError as e:
            raise RunStateError(f"rank {rank}: cannot join the rendezvous at {at}: {str(e).splitlines()[0]}") from None
    # A torchrun restart reuses the agent's store: keys of one attempt only.
    prefix = f"splat/join/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    try:
        store.set(f"{prefix}{rank}", str(os.getpid()))
        while True:
            missing = [r for r in range(world) if not store.check([f"{prefix}{r}"])]
            if not missing:
                return store
            if time.monotonic() >= deadline:
                names = ", ".join(str(r) for r in missing)
                raise RunStateError(
                    f"rank {rank} waited {timeout_s:g} s (distributed.timeout_s) for rank{'s' * (len(missing) > 1)} "
                    f"{names} of WORLD_SIZE={world} to join at {at}: {hint}"
                )
            time.sleep(_POLL_S)
    except dist.DistError as e:
        raise RunStateError(
            f"rank {rank}: the rendezvous store at {at} stopped answering while the ranks joined "
            f"({str(e).splitlines()[0]})"
        ) from None


def _import_modules_that_capture_the_group() -> None:
    """Imports, before the group exists, the torch module whose functions
    take the default group as a default argument value.

    ``torch.distributed.nn.functional`` writes ``group=group.WORLD`` in ten
    signatures, evaluated when it is first imported.  torch imports it
    lazily (the first ``torch.optim`` optimizer imports ``torch._dynamo``,
    which imports FSDP, which imports it), so after init_process_group those
    defaults hold the group itself: destroy_process_group can then not free
    it, gloo's worker threads outlive :func:`leave`, and they are torn down
    with the interpreter at exit, where a thread still releasing a
    collective's tensors aborts the process ("terminate called without an
    active exception", rare: it failed a CI run once, after a passing
    three-process training test).
    Imported first, those defaults are None, and leave() really ends the
    group (tests/test_distributed_group.py checks that its threads are gone)."""
    import torch.distributed.nn.functional  # noqa: F401


def leave(group: Group, synchronize: bool = True) -> None:
    """Leaves the process group (nothing for one process).

    destroy_process_group() frees the group, and gloo joins its worker
    threads here, while the interpreter is whole.  Threads left to the
    interpreter's exit may still be releasing a collective's tensors, which
    takes the GIL from a dying interpreter and aborts a process that has
    finished its work ("terminate called without an active exception"):
    see :func:`_import_modules_that_capture_the_group` for what kept the
    group alive until exit.

    ``synchronize`` (the normal end, when every rank leaves): a barrier
    first, so that no rank tears its connections down while a peer still
    finishes the last collective.  On an error path (a peer may be gone)
    there is no barrier."""
    if group.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            if synchronize:
                dist.barrier()
            dist.destroy_process_group()


def on_main(group: Group, fn):
    """``fn()`` on rank 0 only (claiming the output folder, building the
    initial model), its result broadcast to every rank.  When it raises,
    rank 0 re-raises and the other ranks raise a RunStateError quoting it,
    instead of waiting for a rank 0 that has gone."""
    if not group.distributed:
        return fn()
    import torch.distributed as dist

    box = [None, None]  # (result, error text)
    error = None
    if group.is_main:
        try:
            box[0] = fn()
        except BaseException as e:
            error = e
            from ..errors import format_error

            box = [None, format_error(e)]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[1] is not None:
        from ..errors import RunStateError

        raise RunStateError(f"rank 0 failed: {box[1]}")
    return box[0]


def all_gather_objects(value, group: Group) -> list:
    """Every rank's ``value`` (picklable), in rank order."""
    if not group.distributed:
        return [value]
    import torch.distributed as dist

    out = [None] * group.world_size
    dist.all_gather_object(out, value)
    return out
