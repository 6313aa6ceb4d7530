"""Which primitives live on which rank, and moving them.

The primitives of a run form one sequence: rank 0's rows, then rank 1's,
and so on.  A balanced partition gives rank r the rows
``[r n // N, (r + 1) n // N)`` of it (:func:`balanced_slice`), so shard sizes
differ by at most one.  :func:`rebalance` restores that partition after
densification has made the shards drift apart, moving only the rows that
change owner, with everything that belongs to them (every row of the
:class:`splat.state.PrimitiveState` table: parameters, Adam moments,
statistics, ids), in one all-to-all per tensor.

Rebalancing is collective: every rank calls it, in the same order.  With
one process it does no communication.
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch

from .collectives import all_counts
from .exchange import exchange_rows
from .group import Group


def balanced_slice(total: int, world: int, rank: int) -> tuple[int, int]:
    """(start, stop) of rank ``rank``'s rows when ``total`` rows are dealt to
    ``world`` ranks in order, sizes differing by at most one."""
    return rank * total // world, (rank + 1) * total // world


def rebalance_plan(counts: Sequence[int], rank: int) -> tuple[list[int], list[int]]:
    """(send_counts, recv_counts) that move the rows of a partition with shard
    sizes ``counts`` to the balanced partition, keeping their order."""
    world, total = len(counts), sum(counts)
    starts = [sum(counts[:r]) for r in range(world)]

    def overlap(src: int, dst: int) -> int:
        a, b = starts[src], starts[src] + counts[src]
        c, d = balanced_slice(total, world, dst)
        return max(0, min(b, d) - max(a, c))

    return [overlap(rank, d) for d in range(world)], [overlap(s, rank) for s in range(world)]


def imbalance(counts: Sequence[int]) -> float:
    """(largest shard - smallest shard) / mean shard size; 0 for an empty model."""
    mean = sum(counts) / len(counts)
    return (max(counts) - min(counts)) / mean if mean > 0 else 0.0


@torch.no_grad()
def move_rows(rows: Dict[str, torch.Tensor], counts: Sequence[int], group: Group) -> Dict[str, torch.Tensor]:
    """Moves the per-row tensors ``rows`` (each [n_local, ...], same n_local)
    of a partition with shard sizes ``counts`` to the balanced partition."""
    send, recv = rebalance_plan(counts, group.rank)
    if not group.distributed:
        return rows
    return {k: exchange_rows(v, send, recv, group) for k, v in rows.items()}


@torch.no_grad()
def rebalance(state, group: Group, max_imbalance: float) -> bool:
    """Restores the balanced partition of ``state`` (a
    :class:`splat.state.PrimitiveState`: every per-primitive tensor moves
    together) when the shards' :func:`imbalance` exceeds ``max_imbalance``.
    Returns whether anything moved."""
    if not group.distributed:
        return False
    counts = all_counts(state.num_rows, group)
    if max(counts) - min(counts) <= 1 or imbalance(counts) <= max_imbalance:
        return False  # within one row is as balanced as it gets
    state.set_rows(move_rows(state.rows(), counts, group))
    return True
