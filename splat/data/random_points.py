"""Random initial points for a posed scene without a point cloud (and without
pycolmap to triangulate one), placed where the images agree.

::

    from splat.data.random_points import photo_consistent_points
    pts, cols = photo_consistent_points(scene.train, 5000, min_views=0.5)

1. **Where the cameras look.**  Candidates are uniform in a ball around the
   point closest (least squares) to every camera's optical axis, of radius
   the median camera distance to that point; when the axes do not converge
   (forward-facing captures) around the mean camera centre with the cameras'
   spread as radius.  Only candidates in front of and inside the image of at
   least ``min_views`` of the cameras are kept.
2. **Where the images agree.**  Each candidate is projected into every
   training image (at most :data:`SCORE_WIDTH` pixels wide) that sees it;
   a point on a surface sees the same colour in every view that is not
   occluded, a point in free space sees unrelated pixels.  The score is the
   median over views of the colour's L1 distance to the per-channel median
   colour (robust to the up-to-half of views that are occluded); the ``n``
   candidates with the lowest score are kept, coloured with their median
   colour.  This is one pass of space carving / voxel colouring.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..geometry import knn_mean_distance, project_points, seen_by, uniform_in_ball

__all__ = ["axes_meeting_point", "look_region", "photo_consistent_points"]

#: Images are scored at most this wide (area-averaged), which is enough for a
#: first guess of the surfaces and keeps the cost at a few seconds.
SCORE_WIDTH = 200
#: A patch whose value range (max - min, largest over RGB) is below this is flat (no evidence).
TEXTURE_MIN = 0.05
_OFFSETS = torch.tensor([(di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)])  # [9, 2]
#: The best 1/REFINE_KEEP of the candidates are refined with REFINE_COPIES jittered copies each.
REFINE_KEEP = 4
REFINE_COPIES = 4
#: Candidate-views scored at once: a chunk's patches, their sort and the
#: median over views take ~1 KB per candidate-view, so this bounds scoring to
#: ~64 MB (4096 candidates at once made it 250 MB at 60 views, the peak of a
#: whole default training from ``auto``).
SCORE_CANDIDATE_VIEWS = 65536
#: Candidates drawn per kept point.
OVERSAMPLE = 16


def axes_meeting_point(viewmats: torch.Tensor, centers: torch.Tensor) -> Optional[Tuple[torch.Tensor, float]]:
    """(point [3], median camera distance to it) where the cameras' optical
    axes converge, or None when they do not (a forward-facing capture).

    The point is the least-squares point nearest every optical axis; the axes
    converge when that system is well conditioned and the point lies ahead
    of at least 80 % of the cameras."""
    V = viewmats.double()
    c = centers.double()
    d = V[:, 2, :3]  # optical axes (camera +z) in world coordinates
    d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
    P = torch.eye(3, dtype=torch.float64)[None] - d[:, :, None] * d[:, None, :]  # [C, 3, 3]
    A = P.sum(0)
    b = (P @ c[:, :, None]).sum(0)[:, 0]
    eig = torch.linalg.eigvalsh(A / len(c))
    if float(eig[0]) <= 0.02:
        return None
    x = torch.linalg.solve(A, b)
    ahead = ((x[None] - c) * d).sum(1)  # depth of x along each axis
    if float((ahead > 0).double().mean()) <= 0.8:
        return None
    return x.float(), float((c - x[None]).norm(dim=1).median())


def look_region(viewmats: torch.Tensor, centers: torch.Tensor) -> Tuple[torch.Tensor, float]:
    """(centre [3], radius) of the region the cameras look at: where their
    optical axes meet (:func:`axes_meeting_point`), with the median camera
    distance to it as radius; otherwise the mean camera centre and 1.1x the
    largest camera distance from it (the cameras' spread)."""
    meet = axes_meeting_point(viewmats, centers)
    if meet is not None:
        return meet
    c = centers.double()
    mean = c.mean(0)
    spread = float((c - mean).norm(dim=1).max()) * 1.1
    return mean.float(), spread if spread > 0 else 1.0


def photo_consistent_points(
    frames: Sequence,
    n: int,
    min_views: float = 0.5,
    generator: Optional[torch.Generator] = None,
    oversample: int = OVERSAMPLE,
    allowed: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` points where the training ``frames`` look and agree in colour
    (see the module doc).  ``allowed`` (points [K, 3] -> [K] bool), if given,
    restricts the candidates to the points it accepts (filling the holes
    another source left, :mod:`splat.data.initial_points`); fewer than ``n``
    may then be found.  Returns (points [<= n, 3], colours [<= n, 3] in [0, 1])."""
    if n <= 0 or not frames:
        return torch.zeros(0, 3), torch.zeros(0, 3)
    V = torch.stack([f.viewmat for f in frames]).float()  # [C, 4, 4]
    Ks = torch.stack([f.K for f in frames]).float()  # [C, 3, 3]
    centers = torch.stack([f.camera_center for f in frames]).float()  # [C, 3]
    C = len(frames)
    center, radius = look_region(V, centers)
    need = max(1, int(math.ceil(min_views * C)))

    # Images at scoring resolution; K scales exactly under the pixel-centre convention.
    imgs, scale = [], []
    for f in frames:
        s = max(1, int(math.ceil(f.width / SCORE_WIDTH)))
        img = f.image.permute(2, 0, 1)[None]
        if s > 1:
            img = F.avg_pool2d(img[..., : f.height // s * s, : f.width // s * s], s)
        imgs.append(img[0])
        scale.append(s)

    W = torch.tensor([f.width for f in frames], dtype=torch.float32)[:, None]  # [C, 1]
    H = torch.tensor([f.height for f in frames], dtype=torch.float32)[:, None]
    cands = []
    total, want = 0, n * max(1, int(oversample))
    for _ in range(50):
        p = uniform_in_ball(max(2 * want, 4096), center, radius, generator)
        keep = seen_by(p, V, Ks, W, H).sum(0) >= need
        if allowed is not None:
            keep &= allowed(p)
        cands.append(p[keep])
        total += int(keep.sum())
        if total >= want:
            break
    p = torch.cat(cands)[:want]
    if len(p) == 0:
        return p, torch.zeros(0, 3)

    def score_points(p):
        """(score, colour): higher is more photo-consistent."""
        uv, z = project_points(p, V, Ks)
        # A 3x3 RGB patch around the candidate in every view that sees it,
        # sorted per channel: invariant to the patch's rotation between views
        # (a ring of cameras turns a floor's texture by up to 180 degrees).
        patches = torch.full((C, len(p), 3, 9), float("nan"))
        for c, (img, s) in enumerate(zip(imgs, scale)):
            h, w = img.shape[1:]
            j = torch.floor(uv[c, :, 0] / s).long()
            i = torch.floor(uv[c, :, 1] / s).long()
            ok = (z[c] > 1e-6) & (j >= 1) & (j < w - 1) & (i >= 1) & (i < h - 1)
            rows = i[ok, None] + _OFFSETS[:, 0]
            cols = j[ok, None] + _OFFSETS[:, 1]
            patches[c, ok] = img[:, rows, cols].permute(1, 0, 2)
        centre = patches[..., 4]  # [C, M, 3]
        sorted_p = patches.sort(dim=-1).values.flatten(2)  # [C, M, 27]
        seen = torch.isfinite(centre[..., 0])
        ref = sorted_p.nanmedian(dim=0).values  # [M, 27]
        dev = (sorted_p - ref[None]).abs().mean(-1)  # [C, M], NaN where unseen
        score = -dev.nanmedian(dim=0).values
        # Flat patches (plain background, sky) are consistent but say nothing
        # about where a surface is: they rank after every textured candidate.
        flat = (ref.view(-1, 3, 9).amax(-1) - ref.view(-1, 3, 9).amin(-1)).amax(-1) < TEXTURE_MIN
        score = torch.where(flat, score - 10.0, score)
        score = torch.where(seen.sum(0) >= need, score, torch.full_like(score, -100.0))
        score = torch.nan_to_num(score, nan=-100.0)
        return score, centre.nanmedian(dim=0).values

    def score_in_chunks(p):
        """score_points over chunks of candidates (see SCORE_CANDIDATE_VIEWS):
        its patches are [views, candidates, 27] floats, 2 GB at once for 60 views."""
        chunk = max(64, SCORE_CANDIDATE_VIEWS // C)
        parts = [score_points(p[i : i + chunk]) for i in range(0, len(p), chunk)]
        return torch.cat([s for s, _ in parts]), torch.cat([m for _, m in parts])

    # Coarse to fine: score the candidates, then jitter the best ones by about
    # their spacing and score again (sharper surfaces for the same cost).
    score, med = score_in_chunks(p)
    best = p[torch.argsort(-score, stable=True)[: max(n, len(p) // REFINE_KEEP)]]
    spacing = float(knn_mean_distance(best, k=3).median()) if len(best) > 3 else 0.0
    jitter = best.repeat(REFINE_COPIES, 1)
    jitter = jitter + 0.5 * spacing * torch.randn(jitter.shape, generator=generator)
    if allowed is not None:
        jitter = jitter[allowed(jitter)]
    p = torch.cat([best, jitter])
    score, med = score_in_chunks(p)
    order = torch.argsort(-score, stable=True)[:n]
    return p[order].contiguous(), med[order].clamp(0, 1).contiguous()
