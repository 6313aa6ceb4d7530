"""``far_points``: ``auto``'s last fill puts points on a far sphere where
the views agree (a sky), and nowhere they disagree (issue 26)."""

from __future__ import annotations

import math

import torch

from splat.data.far_points import FAR_SPHERE_RADII, far_points
from splat.data.initial_points import COVERAGE_CELLS, coverage
from splat.data.random_points import look_region
from splat.data.types import Frame
from splat.geometry import pixel_rays
from splat.testing import intrinsics, look_at_viewmat

W, H = 64, 48
N_VIEWS = 16


def _frames(image_of) -> list:
    """A ring of cameras around the origin; ``image_of(V, K)`` -> [H, W, 3]."""
    K = intrinsics(W, H, 60.0, dtype=torch.float32)
    frames = []
    for i in range(N_VIEWS):
        a = 2 * math.pi * i / N_VIEWS
        V = look_at_viewmat((3.0 * math.cos(a), -1.0, 3.0 * math.sin(a)), (0.0, 0.0, 0.0), dtype=torch.float32)
        frames.append(
            Frame(
                stem=f"v{i}",
                image_path=None,
                image=image_of(V, K).contiguous(),
                mask=None,
                viewmat=V,
                K=K,
                width=W,
                height=H,
            )
        )
    return frames


def _sky(V: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """An environment at infinity: the colour depends on the ray's world
    direction only, a gentle gradient as a clear sky has."""
    d = pixel_rays(K, H, W).float() @ V[:3, :3]  # [H*W, 3] world directions (R^T r)
    d = d / d.norm(dim=1, keepdim=True)
    return (0.6 + 0.05 * d).reshape(H, W, 3)


def _all_cells(frames) -> list:
    rows = math.ceil(H / (W / COVERAGE_CELLS))
    return [torch.ones(rows, COVERAGE_CELLS, dtype=torch.bool) for _ in frames]


def test_a_sky_is_filled_on_the_far_sphere():
    frames = _frames(_sky)
    pts, cols = far_points(frames, _all_cells(frames))
    assert coverage(pts, frames) > 0.9
    # On the sphere: FAR_SPHERE_RADII look-region radii from where the cameras look.
    center, radius = look_region(
        torch.stack([f.viewmat for f in frames]), torch.stack([f.camera_center for f in frames])
    )
    dist = (pts - center).norm(dim=1)
    assert torch.allclose(dist, torch.full_like(dist, FAR_SPHERE_RADII * radius), rtol=1e-4)
    assert float((cols - 0.6).abs().max()) <= 0.05 + 1e-6  # the sky's own colours


def test_views_that_disagree_get_no_far_points():
    """Independent noise in every view: no far point agrees with two views
    (the same test refuses a near surface whose other views show other things)."""
    g = torch.Generator().manual_seed(0)
    frames = _frames(lambda V, K: torch.rand(H, W, 3, generator=g))
    pts, _ = far_points(frames, _all_cells(frames))
    assert coverage(pts, frames) < 0.05, coverage(pts, frames)


def test_only_the_holes_cast_rays():
    frames = _frames(_sky)
    holes = _all_cells(frames)
    for h in holes:
        h[:, COVERAGE_CELLS // 2 :] = False  # the right half of every view is covered already
    pts, _ = far_points(frames, holes)
    V = torch.stack([f.viewmat for f in frames])
    # Each point comes from a left-half cell of some view; merging keeps one
    # candidate per patch of sky, so some view must see it in its left half.
    from splat.geometry import project_points

    uv, z = project_points(pts, V, torch.stack([f.K for f in frames]))
    left = (
        (z > 0) & (uv[..., 0] >= 0) & (uv[..., 0] < W / 2 + W / COVERAGE_CELLS) & (uv[..., 1] >= 0) & (uv[..., 1] < H)
    ).any(0)
    assert bool(left.all())
    none, _ = far_points(frames, [torch.zeros_like(h) for h in holes])
    assert len(none) == 0
