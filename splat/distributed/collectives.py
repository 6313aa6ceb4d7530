"""Small collectives over the ranks of a :class:`~splat.distributed.group.Group`.

Every rank calls them, in the same order; with one process they return
their input and do no communication.  Bookkeeping tensors live where the
backend can move them (:func:`comm_device`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .group import Group

__all__ = ["comm_device", "all_counts", "all_sum", "gather_all", "gather_to_main"]


def comm_device(group: Group) -> torch.device:
    """Where small bookkeeping tensors of a collective must live: NCCL moves GPU memory only."""
    return group.device if group.backend == "nccl" else torch.device("cpu")


def all_counts(n_local: int, group: Group) -> list[int]:
    """Every rank's ``n_local``, in rank order."""
    if not group.distributed:
        return [int(n_local)]
    import torch.distributed as dist

    t = torch.tensor([int(n_local)], dtype=torch.int64, device=comm_device(group))
    out = [torch.empty_like(t) for _ in range(group.world_size)]
    dist.all_gather(out, t)
    return [int(o) for o in out]


def all_sum(values: Sequence[float], group: Group) -> list[float]:
    """Element-wise sum over the ranks of a short list of numbers (float64)."""
    if not group.distributed:
        return [float(v) for v in values]
    return all_sum_tensor(torch.tensor([float(v) for v in values], dtype=torch.float64), group).tolist()


def all_sum_tensor(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` summed element-wise over the ranks (a new tensor, on ``x``'s device)."""
    if not group.distributed:
        return x.clone()
    import torch.distributed as dist

    t = x.to(comm_device(group)).contiguous().clone()
    dist.all_reduce(t)
    return t.to(x.device)


def gather_all(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Every rank's ``x`` [n_r, ...] concatenated in rank order, on every
    rank (an all-gather of rows of different counts)."""
    if not group.distributed:
        return x
    import torch.distributed as dist

    counts, padded = _padded(x, group)
    out = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(out, padded)
    return torch.cat([o[:c] for o, c in zip(out, counts)]).to(x.device)


def gather_to_main(x: torch.Tensor, group: Group):
    """Every rank's ``x`` [n_r, ...] concatenated in rank order on rank 0
    (None on the others): the whole model meets only where it is written."""
    if not group.distributed:
        return x
    import torch.distributed as dist

    counts, padded = _padded(x, group)
    out = [torch.empty_like(padded) for _ in counts] if group.is_main else None
    dist.gather(padded, out, dst=0)
    if not group.is_main:
        return None
    return torch.cat([o[:c] for o, c in zip(out, counts)]).to(x.device)


def _padded(x: torch.Tensor, group: Group):
    """(every rank's row count, ``x`` padded with zero rows to the largest),
    for the collectives that need equal shapes."""
    counts = all_counts(x.shape[0], group)
    padded = x.new_zeros((max(counts),) + tuple(x.shape[1:]), device=comm_device(group))
    padded[: x.shape[0]] = x.to(padded.device)
    return counts, padded
