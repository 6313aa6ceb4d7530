"""A :class:`splat.model.GaussianModel` spread over ranks: each rank's
model holds its shard, rows tagged with their global ``ids``.

* :func:`shard_of` deals a whole model out (the initial model, built once);
* :func:`render_model` renders a batch of cameras from every rank's shard;
* :func:`whole_model` gathers the shards on rank 0, rows in id order (the
  order one process keeps), for ``point_cloud.ply``;
* :func:`sum_replicated_gradients` for parameters every rank holds whole
  (the appearance corrections).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch

from ..model import GaussianModel
from .collectives import gather_to_main
from .group import Group
from .shard import balanced_slice
from .sharded_render import Camera, ShardedRender, render_sharded


def shard_of(params: Dict[str, torch.Tensor], sh_degree: int, group: Group) -> GaussianModel:
    """This rank's balanced slice of the whole model ``params`` (raw
    parameters, rows = ids 0 .. n-1)."""
    n = params["means"].shape[0]
    start, stop = balanced_slice(n, group.world_size, group.rank)
    # Copies: a view would keep the whole model alive on every rank.
    return GaussianModel(
        {k: v[start:stop].clone() for k, v in params.items()}, sh_degree, ids=torch.arange(start, stop), next_id=n
    )


def render_model(
    model: GaussianModel,
    cameras: Sequence[Camera],
    group: Group,
    sh_degree: int,
    near: float,
    far: float,
    owners: Optional[Sequence[int]] = None,
) -> ShardedRender:
    """:func:`splat.distributed.render_sharded` of ``model``'s shard with SH
    degree ``sh_degree`` (``owners``: the rank of each camera, default round robin)."""
    return render_sharded(
        model.means,
        model.quats,
        model.scales,
        model.opacities,
        model.colors(sh_degree),
        model.ids.to(model.means.device),
        cameras,
        group,
        near=near,
        far=far,
        sh_degree=sh_degree,
        owners=owners,
    )


@torch.no_grad()
def whole_model(model: GaussianModel, group: Group):
    """Every rank's surfels in one model on rank 0 (None on the others),
    rows in id order.  Collective; the model as it is with one process."""
    if not group.distributed:
        return model
    ids = gather_to_main(model.ids, group)
    params = {k: gather_to_main(v.detach(), group) for k, v in model.params.items()}
    if ids is None:
        return None
    order = torch.argsort(ids)
    return GaussianModel(
        {k: v[order] for k, v in params.items()}, model.sh_degree, ids=ids[order], next_id=model.next_id
    )


def sum_replicated_gradients(module: torch.nn.Module, group: Group, sparse: bool = False) -> None:
    """Sums over the ranks the gradients of ``module``'s parameters, which
    every rank holds whole; a rank whose cameras did not reach a parameter
    contributes zeros.  ``sparse``: the gradients are row-sparse (embedding
    lookups, for ``SparseAdam``), and stay so: the rows any rank touched,
    with their sums.  Collective, the same calls on every rank (a rank
    with no gradient cannot tell sparse from dense, so the caller says)."""
    if not group.distributed:
        return
    import torch.distributed as dist

    for p in module.parameters():
        dense = torch.zeros_like(p)
        touched = torch.zeros(p.shape[0], dtype=p.dtype, device=p.device)
        if p.grad is not None and p.grad.is_sparse:
            g = p.grad.coalesce()
            dense.index_add_(0, g.indices()[0], g.values())
            touched[g.indices()[0]] = 1
        elif p.grad is not None:
            dense += p.grad
            touched += 1
        dist.all_reduce(dense)
        if not sparse:
            p.grad = dense
            continue
        dist.all_reduce(touched)
        rows = touched.nonzero().flatten()
        # rows is nonzero() of a [rows] vector: in range, sorted and unique, so
        # torch's invariant check (and its warning when not asked) is not needed.
        p.grad = torch.sparse_coo_tensor(rows[None], dense[rows], p.shape, check_invariants=False).coalesce()
