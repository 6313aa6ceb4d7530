"""Rendering a batch of cameras whose surfels are spread over the ranks.

Every surfel lives on exactly one rank (its owner).  For a batch of B
cameras, :func:`render_sharded` does, on every rank at once:

1. **project where the surfels live**: for each camera, the owner projects
   its surfels (PyTorch, :func:`splat.rasterize._project`, with autograd),
   evaluates their colour, folds in the ``means2d`` translation handle and
   keeps the ones whose pixel rectangle is not empty;
2. **send what each camera's rank needs**: camera i is rendered by rank
   :func:`camera_rank` (i mod N); each visible surfel's kernel record (19
   floats: Tuvw 9, centre 2, normal 3, colour 3, opacity, depth) and its
   pixel rectangle and global id (5 int64) travel in ONE differentiable
   all-to-all (:func:`splat.distributed.exchange.exchange_rows`);
3. **rasterize there**, with the received surfels in global-id order, so a
   camera sees the same surfels in the same order whatever the partition;
4. **send the gradients back**: the all-to-all's backward returns each
   record's gradient to its owner, where autograd continues through the
   projection into the parameters and the ``means2d`` handles.

B need not be a multiple of N: ranks below B mod N render one camera more
than the others, and a rank may render none (B < N); it still takes part in
the exchange (the ``anchor``).

The maths is :func:`splat.rasterize`'s (same projection, kernels and
composition); only where each step runs differs.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from ..outputs import compose
from ..rasterize import _empty_sums, _RasterizeSurfels, project_for_kernels
from .exchange import comm_device, exchange_rows
from .group import Group

#: Floats per surfel record: Tuvw 9, centre 2, normal 3, colour 3, opacity 1, depth 1.
RECORD_FLOATS = 19
#: int64 per surfel record: pixel rectangle 4, global id 1.
RECORD_INTS = 5
_SPLIT = (9, 2, 3, 3, 1, 1)


@dataclasses.dataclass
class Camera:
    """One camera of a batch: world -> camera ``viewmat`` [4, 4], ``K`` [3, 3]
    (splat's conventions), image size, and the background [3] or None."""

    viewmat: torch.Tensor
    K: torch.Tensor
    width: int
    height: int
    background: Optional[torch.Tensor] = None


@dataclasses.dataclass
class ShardedRender:
    """What :func:`render_sharded` returns on one rank.

    Attributes:
        outputs: camera index -> :class:`RasterOutput` for the cameras this
            rank renders (``radii`` and ``means2d`` are None there: they
            belong to the owners, below).
        means2d: per camera of the batch, [n_local, 2] handles of this
            rank's surfels; after backward their ``.grad`` is dL/d(screen
            translation), as :func:`splat.rasterize`'s ``means2d``.
        radii: per camera of the batch, [n_local] int32 (0: not drawn).
        anchor: a zero scalar joined to the exchanged rows: add it to the
            loss so that every rank runs the exchange's backward.
        bytes_sent: bytes this rank sends in the forward exchange (records
            and their ints) to other ranks.
        bytes_backward: bytes this rank sends in the backward exchange: the
            gradients (floats) of the records it received from other ranks.
    """

    outputs: dict
    means2d: list
    radii: list
    anchor: torch.Tensor
    bytes_sent: int
    bytes_backward: int = 0


def camera_rank(index: int, world_size: int) -> int:
    """The rank that renders camera ``index`` of a batch: round robin."""
    return index % world_size


def render_sharded(
    means: torch.Tensor,  # [N, 3]
    quats: torch.Tensor,  # [N, 4]
    scales: torch.Tensor,  # [N, 2]
    opacities: torch.Tensor,  # [N]
    colors: torch.Tensor,  # [N, 3] or [N, K, 3] SH coefficients
    ids: torch.Tensor,  # [N] int64
    cameras: Sequence[Camera],
    group: Group,
    near: float = 0.2,
    far: float = 100.0,
    sh_degree: Optional[int] = None,
    owners: Optional[Sequence[int]] = None,
) -> ShardedRender:
    """Renders ``cameras`` from the surfels of every rank (see the module doc).

    Args:
        means, quats, scales, opacities, colors: this rank's surfels, as
            :func:`splat.rasterize` takes them ([n, 3], [n, 4], [n, 2], [n],
            [n, 3] or SH [n, K, 3] with ``sh_degree``).
        ids: [n] int64 global identities, unique over all ranks; a camera
            renders its surfels in increasing id order.
        cameras: the whole batch, the same list on every rank.
        group: this process's :class:`~splat.distributed.group.Group`.
        owners: the rank that renders each camera, the same list on every
            rank (default :func:`camera_rank`'s round robin); a camera whose
            render another camera's loss needs goes to that camera's rank.
    """
    world, rank = group.world_size, group.rank
    if owners is None:
        owners = [camera_rank(i, world) for i in range(len(cameras))]
    elif len(owners) != len(cameras) or any(not 0 <= o < world for o in owners):
        raise ValueError(f"owners: {len(cameras)} ranks in [0, {world}) expected, got {list(owners)}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (means, quats, scales, opacities, colors))
    floats, ints, handles, radii = [], [], [], []
    for cam in cameras:
        fused = means.device.type in ("cpu", "cuda") and not (cam.viewmat.requires_grad or cam.K.requires_grad)
        proj, rgb, means2d, Tuvw, center = project_for_kernels(
            means,
            quats,
            scales,
            opacities,
            colors,
            cam.viewmat,
            cam.K,
            cam.width,
            cam.height,
            near,
            far,
            sh_degree,
            grad,
            fused,
        )
        rect = proj["pixel_rect"]
        sel = ((rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])).nonzero().flatten()
        # One gather of the joined columns: one index_add_ in the backward
        # instead of six accumulating index_put_s.  sel is unique, so the
        # gradients are the same bit for bit.
        columns = [Tuvw, center, proj["normal"], rgb, opacities[:, None], proj["depth"][:, None]]
        floats.append(torch.cat(columns, 1).index_select(0, sel))
        ints.append(torch.cat([rect.long(), ids[:, None].long()], 1).index_select(0, sel))
        handles.append(means2d)
        radii.append(proj["radii"])

    # Rows go out grouped by destination rank, cameras in batch order within.
    order = sorted(range(len(cameras)), key=lambda i: (owners[i], i))
    x = torch.cat([floats[i] for i in order]) if order else means.new_zeros(0, RECORD_FLOATS)
    xi = (
        torch.cat([ints[i] for i in order])
        if order
        else torch.zeros(0, RECORD_INTS, dtype=torch.int64, device=means.device)
    )
    send_counts = [sum(floats[i].shape[0] for i in order if owners[i] == d) for d in range(world)]
    # Per-camera row counts, to cut what arrives into cameras.
    mine = [i for i in range(len(cameras)) if owners[i] == rank]
    per_camera = _exchange_camera_counts([floats[i].shape[0] for i in order], owners, order, group)
    recv_counts = [sum(per_camera[s]) for s in range(world)]
    y = exchange_rows(x, send_counts, recv_counts, group)
    yi = exchange_rows(xi, send_counts, recv_counts, group)

    blocks = {i: [] for i in mine}
    start = 0
    for s in range(world):
        for i, count in zip(mine, per_camera[s]):
            blocks[i].append((start, start + count))
            start += count
    outputs = {}
    for i in mine:
        cam = cameras[i]
        rec, irec = _in_id_order(y, yi, blocks[i])
        if rec.shape[0] == 0:  # nothing in view: the background, joined to the graph by the anchor
            sums = _empty_sums(cam.width, cam.height, y.dtype, y.device)
        else:
            Tuvw, center, normal, rgb, opacity, depth = torch.split(rec, _SPLIT, dim=1)
            sums = _RasterizeSurfels.apply(
                Tuvw,
                center,
                normal,
                rgb,
                opacity[:, 0],
                depth[:, 0].detach(),
                irec[:, :4].to(torch.int32),
                cam.width,
                cam.height,
                near,
                far,
            )
        outputs[i] = compose(*sums, background=cam.background, radii=None, means2d=None)
    anchor = y.sum() * 0.0 if y.requires_grad else y.new_zeros(())
    bytes_sent = (
        x.numel() * x.element_size()
        + xi.numel() * xi.element_size()
        - (sum(floats[i].numel() * x.element_size() + ints[i].numel() * 8 for i in mine))
    )  # rows kept here do not travel
    from_others = sum(c for s, c in enumerate(recv_counts) if s != rank)
    return ShardedRender(
        outputs=outputs,
        means2d=handles,
        radii=radii,
        anchor=anchor,
        bytes_sent=int(bytes_sent),
        bytes_backward=int(from_others * RECORD_FLOATS * x.element_size()),
    )


def _in_id_order(y, yi, blocks):
    """The rows of ``y`` / ``yi`` in ``blocks`` [(start, stop)], sorted by
    global id (column 4 of ``yi``): the order a camera draws its surfels in,
    whatever the partition.  One block already in order (one process keeps
    its rows so) is taken as a slice, with no copy."""
    if len(blocks) == 1:
        a, b = blocks[0]
        ids = yi[a:b, 4]
        if bool((ids[1:] > ids[:-1]).all()):
            return y[a:b], yi[a:b]
    rows = torch.cat(
        [torch.arange(a, b, device=y.device) for a, b in blocks] + [torch.zeros(0, dtype=torch.int64, device=y.device)]
    )
    rows = rows[torch.argsort(yi[rows, 4], stable=True)]
    return y[rows], yi[rows]


def _exchange_camera_counts(counts_in_order, owners, order, group: Group) -> list[list[int]]:
    """[source rank][k]: rows the source sends for this rank's k-th camera."""
    world, rank = group.world_size, group.rank
    cameras_of = [[i for i in order if owners[i] == d] for d in range(world)]
    if not group.distributed:
        return [list(counts_in_order)]
    import torch.distributed as dist

    send = torch.tensor(counts_in_order, dtype=torch.int64, device=comm_device(group))
    recv = send.new_empty(world * len(cameras_of[rank]))
    dist.all_to_all_single(recv, send, [len(cameras_of[rank])] * world, [len(c) for c in cameras_of])
    return recv.reshape(world, len(cameras_of[rank])).tolist()
