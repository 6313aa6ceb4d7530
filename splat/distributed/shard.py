"""Which surfels live on which rank, and moving them (issue 23).

The surfels of a run form one sequence: rank 0's rows, then rank 1's, and
so on.  A balanced partition gives rank r the rows
``[r n // N, (r + 1) n // N)`` of it (:func:`balanced_slice`), so shard sizes
differ by at most one.  :func:`rebalance` restores that partition after
densification has made the shards drift apart, moving only the rows that
change owner, with everything that belongs to them (Adam moments,
densification statistics, identities), in one all-to-all per tensor.

Collectives here are called by every rank, in the same order.  With one
process they do no communication.
"""
from __future__ import annotations

from typing import Dict, Sequence

import torch

from .exchange import comm_device, exchange_rows
from .group import Group


def balanced_slice(total: int, world: int, rank: int) -> tuple[int, int]:
    """(start, stop) of rank ``rank``'s rows when ``total`` rows are dealt to
    ``world`` ranks in order, sizes differing by at most one."""
    return rank * total // world, (rank + 1) * total // world


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
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=comm_device(group))
    dist.all_reduce(t)
    return t.tolist()


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


def _padded(x: torch.Tensor, group: Group):
    """(every rank's row count, ``x`` padded with zero rows to the largest),
    for the collectives that need equal shapes."""
    counts = all_counts(x.shape[0], group)
    padded = x.new_zeros((max(counts),) + tuple(x.shape[1:]), device=comm_device(group))
    padded[: x.shape[0]] = x.to(padded.device)
    return counts, padded


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
def rebalance(model, optimizers: Dict, strategy, group: Group, max_imbalance: float) -> bool:
    """Restores the balanced partition when the shards' :func:`imbalance`
    exceeds ``max_imbalance``: parameters, their Adam moments, the strategy's
    per-surfel statistics and the identities move together.  Returns whether
    anything moved."""
    if not group.distributed:
        return False
    counts = all_counts(model.num_gaussians, group)
    if max(counts) - min(counts) <= 1 or imbalance(counts) <= max_imbalance:
        return False  # within one surfel is as balanced as it gets
    rows = model_rows(model, optimizers, strategy)
    set_model_rows(model, optimizers, strategy, move_rows(rows, counts, group))
    return True


def model_rows(model, optimizers: Dict, strategy) -> Dict[str, torch.Tensor]:
    """Every per-surfel tensor of a training run, by name: ``ids``,
    ``param/<name>``, ``adam/<name>/<moment>`` and ``strategy/<key>``."""
    rows = {"ids": model.ids.to(model.means.device)}
    for name, p in model.params.items():
        rows[f"param/{name}"] = p.detach()
        opt = optimizers.get(name)
        state = opt.state.get(p, {}) if opt is not None else {}
        for key, v in state.items():
            if key != "step" and torch.is_tensor(v) and v.dim() > 0:
                rows[f"adam/{name}/{key}"] = v
    for key, v in strategy.row_state(model.num_gaussians).items():
        rows[f"strategy/{key}"] = v.to(model.means.device)  # (loaded from a checkpoint: on the CPU)
    return rows


def set_model_rows(model, optimizers: Dict, strategy, rows: Dict[str, torch.Tensor]) -> None:
    """Replaces every per-surfel tensor by ``rows`` (as :func:`model_rows` names them)."""
    from ..strategy import update_params

    for name in list(model.params.keys()):
        update_params(model, optimizers, lambda _n, _p, name=name: rows[f"param/{name}"],
                      lambda key, _v, name=name: rows[f"adam/{name}/{key}"], names=[name])
    model.ids = rows["ids"].cpu()
    strategy.set_row_state({k[len("strategy/"):]: v for k, v in rows.items() if k.startswith("strategy/")})


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
