"""Rows of a tensor sent between ranks, inside the autograd graph.

:func:`exchange_rows` is one ``all_to_all_single``: rank r sends
``send_counts[d]`` consecutive rows of its input to each rank d and
receives ``recv_counts[s]`` rows from each rank s, concatenated in rank
order.  It is a linear map that only moves values, so its exact backward is
the same exchange in reverse: the gradient of every received row goes back
to the rank and row it came from.  With one process it is the identity.

Every rank must call it (and, through backward(), its backward) the same
number of times in the same order: these are collectives.  So a rank whose
loss does not use what it received must still connect it to its loss (a
zero term; :func:`splat.distributed.sharded_render.render_sharded` returns one).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .collectives import comm_device
from .group import Group


def exchange_counts(send_counts: Sequence[int], group: Group) -> list[int]:
    """Tells every rank how many rows it will receive: returns
    ``recv_counts`` [world_size] where ``recv_counts[s]`` is what rank s
    passed as ``send_counts[this rank]``."""
    if not group.distributed:
        return [int(c) for c in send_counts]
    import torch.distributed as dist

    send = torch.tensor([int(c) for c in send_counts], dtype=torch.int64, device=comm_device(group))
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return [int(c) for c in recv.tolist()]


def exchange_rows(
    x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group: Group
) -> torch.Tensor:
    """Sends rows of ``x`` [sum(send_counts), ...] to the ranks: the first
    send_counts[0] to rank 0, the next send_counts[1] to rank 1, ...
    Returns the rows received [sum(recv_counts), ...], rank 0's first.
    Differentiable (see the module doc); integer tensors are moved as they
    are, without a graph."""
    if not group.distributed:
        return x
    if x.shape[0] != sum(send_counts):
        raise ValueError(f"exchange_rows: x has {x.shape[0]} rows but send_counts add up to {sum(send_counts)}")
    if x.is_floating_point() and torch.is_grad_enabled() and x.requires_grad:
        return _ExchangeRows.apply(x, tuple(int(c) for c in send_counts), tuple(int(c) for c in recv_counts), group)
    return _all_to_all(x, send_counts, recv_counts, group)


def _all_to_all(x, send_counts, recv_counts, group):
    import torch.distributed as dist

    x = x.contiguous()
    out = x.new_empty((sum(recv_counts),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, list(recv_counts), list(send_counts))
    return out


class _ExchangeRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts, group):
        ctx.counts = (send_counts, recv_counts)
        ctx.group = group
        return _all_to_all(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx, grad):
        # (grad is zeros, never None, where no received row reached the loss:
        # autograd materialises it.  But backward runs at all only if the
        # received rows are in the loss's graph: see render_sharded's anchor.)
        send_counts, recv_counts = ctx.counts
        return _all_to_all(grad, recv_counts, send_counts, ctx.group), None, None, None
