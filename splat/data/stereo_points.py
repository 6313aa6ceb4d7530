"""Initial points for a posed scene without a point cloud and without
pycolmap: plane-sweep stereo with the known poses, at low resolution.

::

    from splat.data.stereo_points import stereo_points
    pts, cols = stereo_points(scene.train, 20000)   # [M, 3], [M, 3] in [0, 1], M <= 20000

1. **Depth maps.**  Up to :data:`MAX_REFERENCES` training views, spread
   over the capture, are each a reference view.  Its pixels are swept
   through :data:`NUM_DEPTHS` fronto-parallel planes, uniform in inverse depth
   over the region at least half the cameras see (around the point their
   optical axes meet, :func:`axes_meeting_point`), and warped into
   its :data:`NUM_NEIGHBOURS` nearest cameras that look the same way.  The cost of a
   depth is 1 - NCC of 5x5 grey patches (invariant to exposure changes),
   averaged over the best two neighbours (robust to occlusion); the depth is
   the minimum, refined by a parabola through its neighbouring planes.
   Untextured pixels, weak matches (NCC < :data:`MIN_NCC`), ambiguous ones
   (another depth nearly as good: an edge along the baseline) and minima on
   the range's first or last plane (background beyond the region) are
   dropped.
2. **Geometric consistency.**  A depth is kept where at least
   :data:`MIN_CONSISTENT` other depth maps see the same point within
   :data:`DEPTH_TOLERANCE` relative depth (the filter of COLMAP's stereo
   fusion and MVSNet).
3. ``n`` of the kept pixels, uniformly at random, become the points, with the
   reference image's colour.

This is what COLMAP's ``patch_match_stereo`` and ``stereo_fusion`` do, cut
down to a first guess of the surfaces (its cost and accuracy on DTU scan 24:
``docs/results.md``).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..geometry import camera_to_world, pixel_rays, project_points, seen_by, uniform_in_ball
from .random_points import axes_meeting_point

__all__ = ["stereo_points"]

#: Images are matched at most this wide (area-averaged).
STEREO_WIDTH = 256
MAX_REFERENCES = 24
NUM_NEIGHBOURS = 4
NUM_DEPTHS = 128
#: Neighbours nearer than this fraction of the typical nearest-camera distance give no depth resolution.
MIN_BASELINE = 0.2
#: Neighbours whose optical axis turns more than this (degrees) see the scene too differently.
MAX_AXIS_ANGLE_DEG = 60.0
PATCH = 5
MIN_NCC = 0.6
#: A patch whose grey standard deviation is below this cannot be matched.
MIN_TEXTURE_STD = 0.01
#: The best cost must be at most UNIQUENESS x the best cost over the planes more than UNIQUE_GAP away.
UNIQUENESS = 0.8
UNIQUE_GAP = 3
DEPTH_TOLERANCE = 0.01
MIN_CONSISTENT = 2
#: Samples of the look region, and cameras voting on which are co-visible (depth ranges).
COVISIBILITY_SAMPLES = 200000
COVISIBILITY_CAMERAS = 64


def _stereo_level(frame, width: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(RGB image [1, 3, h, w], grey image [1, 1, h, w], intrinsics [3, 3]) at
    most ``width`` wide.  Area averaging by s scales K exactly (pixel
    (i, j) covers [j, j+1) x [i, i+1))."""
    s = max(1, int(math.ceil(frame.width / width)))
    img = frame.image.permute(2, 0, 1)[None].float()
    h, w = frame.height // s, frame.width // s
    if s > 1:
        img = F.avg_pool2d(img[..., : h * s, : w * s], s)
    grey = (img * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    K = frame.K.clone().float()
    K[:2] /= s
    return img, grey, K


def _local_stats(x: torch.Tensor):
    """Local mean and variance over PATCH x PATCH windows.  x: [B, 1, h, w]."""
    mean = F.avg_pool2d(x, PATCH, stride=1, padding=PATCH // 2, count_include_pad=False)
    sq = F.avg_pool2d(x * x, PATCH, stride=1, padding=PATCH // 2, count_include_pad=False)
    return mean, (sq - mean * mean).clamp_min(0)


def _depth_map(ref, nbrs, depths, chunk=16):
    """Best depth [h, w] (NaN where unmatched) of reference ``ref`` =
    (grey, K, viewmat) against neighbours [(grey, K, viewmat), ...]."""
    g0, K0, V0 = ref
    h, w = g0.shape[-2:]
    rays = pixel_rays(K0, h, w)  # [P, 3]
    m0, v0 = _local_stats(g0)
    s0 = v0.sqrt()
    D = len(depths)
    costs = torch.empty(D, h, w)
    for d0 in range(0, D, chunk):
        ds = depths[d0 : d0 + chunk]
        pts = camera_to_world(V0, (rays[None] * ds[:, None, None]).reshape(-1, 3))  # [d*P, 3]
        ncc_all = []
        for g1, K1, V1 in nbrs:
            uv, z = project_points(pts, V1[None], K1[None])
            H1, W1 = g1.shape[-2:]
            grid = torch.stack([2 * uv[0, :, 0] / W1 - 1, 2 * uv[0, :, 1] / H1 - 1], -1)
            grid = torch.where((z[0] > 1e-6)[:, None], grid, torch.full_like(grid, 2.0))
            warped = F.grid_sample(
                g1, grid.view(1, len(ds) * h, w, 2), mode="bilinear", padding_mode="zeros", align_corners=False
            )
            warped = warped.view(len(ds), 1, h, w)
            inside = F.grid_sample(
                torch.ones_like(g1),
                grid.view(1, len(ds) * h, w, 2),
                mode="bilinear",
                padding_mode="zeros",
                align_corners=False,
            ).view(len(ds), 1, h, w)
            m1, v1 = _local_stats(warped)
            cross = F.avg_pool2d(warped * g0, PATCH, stride=1, padding=PATCH // 2, count_include_pad=False)
            ncc = (cross - m0 * m1) / (s0 * v1.sqrt()).clamp_min(1e-6)
            ncc = torch.where(inside > 0.999, ncc, torch.full_like(ncc, -1.0))
            ncc_all.append(ncc[:, 0])
        ncc_all = torch.stack(ncc_all)  # [N, d, h, w]
        best2 = ncc_all.topk(min(2, len(nbrs)), dim=0).values.mean(0)
        costs[d0 : d0 + len(ds)] = 1 - best2
    cmin, idx = costs.min(0)
    # Sub-plane refinement: a parabola through the minimum and its two neighbours.
    i0 = idx.clamp(1, D - 2)
    c_l = costs.gather(0, (i0 - 1)[None])[0]
    c_c = costs.gather(0, i0[None])[0]
    c_r = costs.gather(0, (i0 + 1)[None])[0]
    denom = c_l - 2 * c_c + c_r
    offset = torch.where(denom > 1e-9, 0.5 * (c_l - c_r) / denom.clamp_min(1e-9), torch.zeros_like(denom))
    inv = 1.0 / depths
    step = inv[1] - inv[0]
    inv_best = inv[i0] + offset.clamp(-0.5, 0.5) * step
    depth = 1.0 / inv_best
    # Uniqueness: the best cost must beat every depth more than UNIQUE_GAP
    # planes away by a margin.  An edge parallel to the baselines matches at
    # every depth (the aperture problem) and is dropped here.
    far_from_best = (torch.arange(D)[:, None, None] - idx[None]).abs() > UNIQUE_GAP
    second = torch.where(far_from_best, costs, torch.full_like(costs, float("inf"))).min(0).values
    ok = (1 - cmin >= MIN_NCC) & (idx > 0) & (idx < D - 1) & (s0[0, 0] >= MIN_TEXTURE_STD)
    ok &= cmin <= UNIQUENESS * second
    return torch.where(ok, depth, torch.full_like(depth, float("nan")))


def stereo_points(
    frames: Sequence,
    n: int,
    generator: Optional[torch.Generator] = None,
    allowed: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    width: Optional[int] = None,
    max_references: Optional[int] = None,
    num_depths: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """At most ``n`` points on the surfaces the training ``frames`` agree on
    (see the module doc).  ``width``, ``max_references`` and ``num_depths``
    (default :data:`STEREO_WIDTH`, :data:`MAX_REFERENCES`, :data:`NUM_DEPTHS`)
    trade detail for time: the cost is about proportional to
    ``width**2 * max_references * num_depths``.  ``allowed`` (points [K, 3] -> [K] bool), if given,
    keeps only the points it accepts, before the ``n`` are drawn (filling the
    holes another source left, :mod:`splat.data.initial_points`).
    Returns (points [M, 3], colours [M, 3] in [0, 1])."""
    empty = (torch.zeros(0, 3), torch.zeros(0, 3))
    if n <= 0 or len(frames) < 2:
        return empty
    V = torch.stack([f.viewmat for f in frames]).float()  # [C, 4, 4]
    centers = torch.stack([f.camera_center for f in frames]).float()  # [C, 3]
    C = len(frames)
    width = width or STEREO_WIDTH
    max_references = max_references or MAX_REFERENCES
    num_depths = num_depths or NUM_DEPTHS
    levels = {}  # only references and their neighbours are needed: computed on first use

    def level(c):
        if c not in levels:
            levels[c] = _stereo_level(frames[c], width)
        return levels[c]

    # Neighbours: the nearest cameras that look the same way (optical axes
    # within MAX_AXIS_ANGLE_DEG) and are not at the same place (baseline at
    # least MIN_BASELINE of the typical nearest-camera distance: a video's
    # still frames give no depth).
    baseline = torch.cdist(centers.double(), centers.double())  # [C, C]
    baseline.fill_diagonal_(float("inf"))
    typical = float(baseline.min(1).values.median())
    axes = V[:, 2, :3].double()
    axes = axes / axes.norm(dim=1, keepdim=True).clamp_min(1e-12)
    usable = (baseline >= MIN_BASELINE * typical) & (axes @ axes.T >= math.cos(math.radians(MAX_AXIS_ANGLE_DEG)))
    baseline = torch.where(usable, baseline, torch.full_like(baseline, float("inf")))
    refs = torch.linspace(0, C - 1, min(C, max_references)).round().long().unique().tolist()
    # The region seen by at least half the cameras (samples of the look ball)
    # bounds each reference's depth range much tighter than the ball itself
    # does when the cameras surround the scene.  At most COVISIBILITY_CAMERAS
    # cameras vote, which bounds the cost for captures of thousands of images.
    voters = torch.linspace(0, C - 1, min(C, COVISIBILITY_CAMERAS)).round().long().unique()
    Ks = torch.stack([f.K for f in frames]).float()
    W = torch.tensor([f.width for f in frames], dtype=torch.float32)[:, None]
    H = torch.tensor([f.height for f in frames], dtype=torch.float32)[:, None]
    meet = axes_meeting_point(V, centers)
    if meet is not None:
        center, radius = meet
        samples = uniform_in_ball(COVISIBILITY_SAMPLES, center, radius, torch.Generator().manual_seed(0))
        votes = seen_by(samples, V[voters], Ks[voters], W[voters], H[voters]).sum(0)
        covisible = samples[votes >= max(2, (len(voters) + 1) // 2)]  # [S, 3]
    else:  # forward-facing: the look region is the cameras' own spread and bounds no depth
        covisible = torch.zeros(0, 3)

    depth_maps = {}
    for r in refs:
        order = [int(o) for o in torch.argsort(baseline[r])[:NUM_NEIGHBOURS] if math.isfinite(float(baseline[r, o]))]
        if not order:
            continue
        # Depth range: the co-visible region's extent in this camera.  For a
        # forward-facing capture (the optical axes do not meet), or where too
        # little of that region is in view, from twice the baseline to its
        # nearest neighbour out to 1000x that: planes uniform in inverse
        # depth then step ~f/256 pixels of disparity.
        here = covisible[seen_by(covisible, V[r][None], Ks[r][None], W[r], H[r])[0]]
        if len(here) >= 100:
            z = project_points(here, V[r][None], Ks[r][None])[1][0]
            near, far = float(torch.quantile(z, 0.005)), float(torch.quantile(z, 0.995))
            near = max(near, 0.05 * max(far, 1e-3))  # the region may reach behind the camera
            far = max(far, near * 1.5)
        else:
            near = 2.0 * max(float(baseline[r, order].min()), 1e-6)
            far = 1000.0 * near
        depths = 1.0 / torch.linspace(1.0 / near, 1.0 / far, num_depths)
        _, g0, K0 = level(r)
        depth_maps[r] = (_depth_map((g0, K0, V[r]), [(*level(o)[1:], V[o]) for o in order], depths), K0)
    if not depth_maps:
        return empty

    pts_all, cols_all = [], []
    keys = list(depth_maps)
    for r in keys:
        depth, K0 = depth_maps[r]
        h, w = depth.shape
        valid = torch.isfinite(depth).view(-1)
        if not valid.any():
            continue
        rays = pixel_rays(K0, h, w)[valid]
        z = depth.view(-1)[valid]
        pts = camera_to_world(V[r], rays * z[:, None])  # [P, 3]
        agree = torch.zeros(len(pts), dtype=torch.int64)
        for s in keys:
            if s == r:
                continue
            ds, Ks = depth_maps[s]
            hs, ws = ds.shape
            uv, zs = project_points(pts, V[s][None], Ks[None])
            j = torch.floor(uv[0, :, 0]).long()
            i = torch.floor(uv[0, :, 1]).long()
            inside = (zs[0] > 1e-6) & (j >= 0) & (j < ws) & (i >= 0) & (i < hs)
            seen = torch.full((len(pts),), float("nan"))
            seen[inside] = ds[i[inside], j[inside]]
            agree += ((seen - zs[0]).abs() <= DEPTH_TOLERANCE * zs[0]).long()
        keep = agree >= min(MIN_CONSISTENT, len(keys) - 1)
        if not keep.any():
            continue
        cols = level(r)[0][0].reshape(3, -1).T[valid]  # the reference's colours at stereo resolution
        pts_all.append(pts[keep])
        cols_all.append(cols[keep])
    if not pts_all:
        return empty
    pts = torch.cat(pts_all)
    cols = torch.cat(cols_all)
    if allowed is not None:
        keep = allowed(pts)
        pts, cols = pts[keep], cols[keep]
    if len(pts) > n:
        pick = torch.randperm(len(pts), generator=generator)[:n]
        pts, cols = pts[pick], cols[pick]
    return pts.contiguous(), cols.clamp(0, 1).contiguous()
