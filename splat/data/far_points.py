"""Initial points for what no source reaches: a sky or a distant backdrop.

::

    from splat.data.far_points import far_points
    pts, cols = far_points(scene.train, holes)     # holes: per view, [rows, cols] bool cells

Triangulation, stereo and photo-consistent random points all look for
surfaces inside the region the cameras look at.  A sky has no texture to
match and lies outside that region, so they leave it empty; a start like
that trains the sky from surfels that densification drags out of the
foreground, at whatever depth they happen to have, and every test view sees
them from a new angle (most of still_life's test-PSNR spread between
inits is its sky: ``docs/results.md``).

The method (one pass of voxel colouring on a sphere):

1. Every cell that the other sources left uncovered, in every view, casts a
   ray through its centre to the **far sphere**: centred where the cameras
   look (:func:`splat.data.random_points.look_region`), of
   :data:`FAR_SPHERE_RADII` times that region's radius.  The hit is a
   candidate, with the cell's mean colour.
2. Candidates closer together than :data:`FAR_SPACING_CELLS` cells (at the
   sphere's distance) are merged: the views overlap and would otherwise
   give the same patch of sky many times.
3. A candidate is kept when most of the views that see it agree with its
   colour (mean absolute difference over RGB at most
   :data:`FAR_COLOR_TOLERANCE`), at least three of them (the view it came
   from always agrees).  A hole that is a near surface -- a floor the
   other sources missed -- projects to unrelated pixels in other views and
   is dropped; a sky, a smooth far backdrop, agrees.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..geometry import project_points
from .random_points import look_region

__all__ = ["far_points", "FAR_SPHERE_RADII", "FAR_SPACING_CELLS", "FAR_COLOR_TOLERANCE"]

#: The far sphere's radius in look-region radii (the median camera distance
#: to where the cameras look).  Far enough for small parallax across the
#: cameras, near enough that a surfel of a few pixels there is not pruned as
#: too big in world space (``strategy.prune_scale3d`` x the scene radius).
FAR_SPHERE_RADII = 3.0
#: Merged candidates are at least this many coverage cells apart (at the sphere).
FAR_SPACING_CELLS = 1.0
#: Largest median colour difference (mean over RGB of |a - b|, in [0, 1])
#: between a candidate and the views that see it.
FAR_COLOR_TOLERANCE = 0.05


def _cell_rays(frame, hole: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(origin [3], unit directions [K, 3] in world, colours [K, 3]) of the
    ``hole`` cells [rows, cols] of one view: rays through the cells' centres."""
    rows, cols = hole.shape
    cell = frame.width / cols
    i, j = hole.nonzero(as_tuple=True)
    u = ((j.float() + 0.5) * cell).clamp(max=frame.width - 0.5)  # pixel coordinates (conventions.py)
    v = ((i.float() + 0.5) * cell).clamp(max=frame.height - 0.5)
    K = frame.K.float()
    cam = torch.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], torch.ones_like(u)], dim=1)  # [K, 3]
    R = frame.viewmat[:3, :3].float()
    d = cam @ R  # R^T cam, row-wise: camera -> world directions
    d = d / d.norm(dim=1, keepdim=True)
    mean = F.adaptive_avg_pool2d(frame.image.float().permute(2, 0, 1)[None], (rows, cols))[0]  # [3, rows, cols]
    return frame.camera_center.float(), d, mean[:, i, j].T


def _hit_sphere(origin: torch.Tensor, d: torch.Tensor, center: torch.Tensor, radius: float) -> torch.Tensor:
    """[K, 3]: where rays ``origin + t d`` (t > 0, unit ``d`` [K, 3]) leave
    the sphere; the origin must be inside it."""
    oc = origin - center  # [3]
    b = d @ oc  # [K]
    c = float(oc @ oc) - radius * radius  # < 0 inside
    t = -b + torch.sqrt((b * b - c).clamp_min(0.0))
    return origin + t[:, None] * d


def _merge(points: torch.Tensor, colors: torch.Tensor, spacing: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One candidate per cube of side ``spacing`` (the first in order), so
    overlapping views do not repeat a patch."""
    keys = torch.floor(points / spacing).long()
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), len(points), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(points)), reduce="amin")
    return points[first], colors[first]


def _agreeing(points: torch.Tensor, colors: torch.Tensor, frames: Sequence) -> torch.Tensor:
    """[K] bool: the views that see each point agree with its colour (see the module doc)."""
    V = torch.stack([f.viewmat for f in frames]).float()
    Ks = torch.stack([f.K for f in frames]).float()
    diffs = torch.full((len(frames), len(points)), float("nan"))
    for start in range(0, len(points), 4096):
        p = points[start : start + 4096]
        uv, z = project_points(p, V, Ks)  # [C, k, 2], [C, k]
        for c, f in enumerate(frames):
            j = torch.floor(uv[c, :, 0]).long()
            i = torch.floor(uv[c, :, 1]).long()
            ok = (z[c] > 1e-6) & (j >= 0) & (j < f.width) & (i >= 0) & (i < f.height)
            seen = f.image[i[ok], j[ok]].float()  # [k', 3]
            d = (seen - colors[start : start + 4096][ok]).abs().mean(-1)
            diffs[c, start : start + 4096][ok] = d
    views = (~diffs.isnan()).sum(0)
    agree = (diffs <= FAR_COLOR_TOLERANCE).sum(0)  # NaN compares False: unseen views never agree
    # The view a candidate came from always agrees: ask for two more, and a majority.
    return (agree >= 3) & (2 * agree > views)


def far_points(frames: Sequence, holes: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Points on the far sphere for the ``holes`` (per frame, [rows, cols]
    bool coverage cells no other source covers) where the views agree (see
    the module doc).  Returns (points [M, 3], colours [M, 3] in [0, 1])."""
    if not frames or not any(bool(h.any()) for h in holes):
        return torch.zeros(0, 3), torch.zeros(0, 3)
    V = torch.stack([f.viewmat for f in frames]).float()
    centers = torch.stack([f.camera_center for f in frames]).float()
    center, look_radius = look_region(V, centers)
    # Every camera must be inside the sphere for a ray to leave it once.
    camera_reach = float((centers - center).norm(dim=1).max())
    radius = max(FAR_SPHERE_RADII * look_radius, 1.5 * camera_reach)

    pts, cols = [], []
    for f, hole in zip(frames, holes):
        if bool(hole.any()):
            origin, d, c = _cell_rays(f, hole)
            pts.append(_hit_sphere(origin, d, center, radius))
            cols.append(c)
    points, colors = torch.cat(pts), torch.cat(cols)
    # A cell's angular size, seen from the sphere's centre at its radius.
    cell_angle = min(
        f.width / hole.shape[1] / math.sqrt(float(f.K[0, 0] * f.K[1, 1])) for f, hole in zip(frames, holes)
    )
    points, colors = _merge(points, colors, FAR_SPACING_CELLS * cell_angle * radius)
    keep = _agreeing(points, colors, frames)
    return points[keep].contiguous(), colors[keep].contiguous()
