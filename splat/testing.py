"""Scene generators for tests and benchmarks (no data files needed)."""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Tuple

import torch


def look_at_viewmat(
    eye: Sequence[float] | torch.Tensor,
    target: Sequence[float] | torch.Tensor,
    up: Sequence[float] | torch.Tensor = (0.0, -1.0, 0.0),
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """World->camera [4, 4], OpenCV convention, camera at ``eye`` looking at ``target``.

    ``up`` is the world direction that should appear towards the top of the
    image (camera -y).
    """
    eye = torch.as_tensor(eye, dtype=dtype)
    forward = torch.as_tensor(target, dtype=dtype) - eye
    forward = forward / forward.norm()
    down = -torch.as_tensor(up, dtype=dtype)
    right = torch.linalg.cross(down, forward)
    right = right / right.norm()
    down = torch.linalg.cross(forward, right)
    rot = torch.stack([right, down, forward])  # rows: camera axes in world
    viewmat = torch.eye(4, dtype=dtype)
    viewmat[:3, :3] = rot
    viewmat[:3, 3] = -rot @ eye
    return viewmat


def intrinsics(
    width: int,
    height: int,
    fov_x_deg: float = 50.0,
    principal_offset: Tuple[float, float] = (0.0, 0.0),
    aspect: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    fx = width / (2 * math.tan(math.radians(fov_x_deg) / 2))
    return torch.tensor(
        [[fx, 0, width / 2 + principal_offset[0]], [0, fx * aspect, height / 2 + principal_offset[1]], [0, 0, 1]],
        dtype=dtype,
    )


def quats_from_normals(normals: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Quaternions [N, 4] (w, x, y, z) whose rotation's third column is ``normals`` [N, 3],
    with a random twist about the normal."""
    n = normals / normals.norm(dim=-1, keepdim=True)
    helper = torch.where(
        n[:, :1].abs() < 0.9, torch.tensor([1.0, 0, 0], dtype=n.dtype), torch.tensor([0, 1.0, 0], dtype=n.dtype)
    )
    t = torch.linalg.cross(helper, n)
    t = t / t.norm(dim=-1, keepdim=True)
    angle = torch.rand(n.shape[0], 1, generator=generator, dtype=n.dtype) * 2 * math.pi
    bitangent = torch.linalg.cross(n, t)
    tu = t * torch.cos(angle) + bitangent * torch.sin(angle)
    tv = torch.linalg.cross(n, tu)
    return rotmat_to_quat(torch.stack([tu, tv, n], dim=-1))


def rotmat_to_quat(R: torch.Tensor) -> torch.Tensor:
    """Quaternions [N, 4] (w, x, y, z) from rotation matrices [N, 3, 3] (Shepperd's method)."""
    m = R
    trace = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    candidates = torch.stack(
        [
            torch.stack([1 + trace, m[:, 2, 1] - m[:, 1, 2], m[:, 0, 2] - m[:, 2, 0], m[:, 1, 0] - m[:, 0, 1]], -1),
            torch.stack(
                [
                    m[:, 2, 1] - m[:, 1, 2],
                    1 + m[:, 0, 0] - m[:, 1, 1] - m[:, 2, 2],
                    m[:, 0, 1] + m[:, 1, 0],
                    m[:, 0, 2] + m[:, 2, 0],
                ],
                -1,
            ),
            torch.stack(
                [
                    m[:, 0, 2] - m[:, 2, 0],
                    m[:, 0, 1] + m[:, 1, 0],
                    1 - m[:, 0, 0] + m[:, 1, 1] - m[:, 2, 2],
                    m[:, 1, 2] + m[:, 2, 1],
                ],
                -1,
            ),
            torch.stack(
                [
                    m[:, 1, 0] - m[:, 0, 1],
                    m[:, 0, 2] + m[:, 2, 0],
                    m[:, 1, 2] + m[:, 2, 1],
                    1 - m[:, 0, 0] - m[:, 1, 1] + m[:, 2, 2],
                ],
                -1,
            ),
        ],
        1,
    )  # [N, 4, 4]
    best = torch.stack([trace, m[:, 0, 0], m[:, 1, 1], m[:, 2, 2]], -1).argmax(-1)
    q = candidates[torch.arange(R.shape[0]), best]
    q = q / q.norm(dim=-1, keepdim=True)
    return q * torch.where(q[:, :1] < 0, -1.0, 1.0)


def random_scene(
    n: int,
    width: int,
    height: int,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    principal_offset: Tuple[float, float] = (0.0, 0.0),
    aspect: float = 1.0,
    scale_range: Tuple[float, float] = (0.05, 0.35),
    depth: float = 4.0,
) -> Dict[str, Any]:
    """Random surfels in a cube of side ~2 in front of a camera at distance ``depth``.

    Returns a dict of the rasterize arguments.  Random orientations give
    grazing surfels; the spread gives partly visible ones at the borders.
    """
    g = torch.Generator().manual_seed(seed)
    lo, hi = scale_range
    scene = dict(
        means=(torch.rand(n, 3, generator=g, dtype=dtype) * 2 - 1) * torch.tensor([1.4, 1.1, 1.0], dtype=dtype),
        quats=torch.randn(n, 4, generator=g, dtype=dtype),
        scales=torch.rand(n, 2, generator=g, dtype=dtype) * (hi - lo) + lo,
        opacities=torch.rand(n, generator=g, dtype=dtype) * 0.85 + 0.1,
        colors=torch.rand(n, 3, generator=g, dtype=dtype),
        viewmat=look_at_viewmat((0.3, -0.2, -depth), (0.0, 0.0, 0.0), dtype=dtype),
        K=intrinsics(width, height, 60.0, principal_offset, aspect, dtype=dtype),
        width=width,
        height=height,
    )
    return scene


def random_gaussians(
    n: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    spread: Tuple[float, float, float] = (1.3, 1.0, 0.8),
    scale_range: Tuple[float, float] = (0.05, 0.3),
) -> Dict[str, torch.Tensor]:
    """n random 3D Gaussians (means, quats, scales [n, 3], opacities, colors)
    in a box of half-sides ``spread`` around the origin, where
    :func:`random_scene`'s camera looks."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = scale_range
    return dict(
        means=(torch.rand(n, 3, generator=g, dtype=dtype) * 2 - 1) * torch.tensor(spread, dtype=dtype),
        quats=torch.randn(n, 4, generator=g, dtype=dtype),
        scales=torch.rand(n, 3, generator=g, dtype=dtype) * (hi - lo) + lo,
        opacities=torch.rand(n, generator=g, dtype=dtype) * 0.8 + 0.15,
        colors=torch.rand(n, 3, generator=g, dtype=dtype),
    )


def surface_scene(
    n: int, width: int, height: int, dtype: torch.dtype = torch.float32, seed: int = 0, distance: float = 3.0
) -> Dict[str, Any]:
    """Surfels on surfaces, with sizes and opacities like a trained model's.

    A ground plane and four spheres, surfels tangent to the surface, scales
    about the surface spacing (log-normal spread, anisotropic), opacities
    mostly high with a tail of faint ones.  For benchmarks.
    """
    g = torch.Generator().manual_seed(seed)
    spheres = torch.tensor(
        [[0.0, -0.5, 0.0, 0.5], [0.9, -0.35, 0.4, 0.35], [-0.8, -0.3, -0.3, 0.3], [0.2, -0.25, -0.9, 0.25]]
    )
    plane_half = 2.0
    areas = torch.cat([torch.tensor([4 * plane_half**2]), 4 * math.pi * spheres[:, 3] ** 2])
    counts = torch.floor(areas / areas.sum() * n).long()
    counts[0] += n - counts.sum()
    pts, nrm = [], []
    xz = (torch.rand(int(counts[0]), 2, generator=g) * 2 - 1) * plane_half
    pts.append(torch.stack([xz[:, 0], torch.zeros_like(xz[:, 0]), xz[:, 1]], -1))
    nrm.append(torch.tensor([0.0, -1.0, 0.0]).expand(int(counts[0]), 3))  # y down is "up" here
    for s, c in zip(spheres, counts[1:]):
        d = torch.randn(int(c), 3, generator=g)
        d = d / d.norm(dim=-1, keepdim=True)
        pts.append(s[:3] + d * s[3])
        nrm.append(d)
    means, normals = torch.cat(pts), torch.cat(nrm)
    spacing = math.sqrt(float(areas.sum()) / n)
    base = spacing * 0.6 * torch.exp(0.4 * torch.randn(n, 1, generator=g))
    scales = base * torch.exp(0.3 * torch.randn(n, 2, generator=g))
    faint = torch.rand(n, generator=g) < 0.25
    opac = torch.where(faint, torch.rand(n, generator=g) * 0.5 + 0.02, 0.75 + 0.25 * torch.rand(n, generator=g))
    eye = (distance * 0.8, -distance * 0.45, -distance * 0.6)
    return dict(
        means=means.to(dtype),
        quats=quats_from_normals(normals.double(), g).to(dtype),
        scales=scales.to(dtype),
        opacities=opac.to(dtype),
        colors=torch.rand(n, 3, generator=g).to(dtype),
        viewmat=look_at_viewmat(eye, (0.0, -0.3, 0.0), dtype=dtype),
        K=intrinsics(width, height, 55.0, dtype=dtype),
        width=width,
        height=height,
    )
