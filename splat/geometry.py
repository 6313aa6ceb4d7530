"""Geometry shared by the model, the data loaders and the mesh tools.

Rotations from quaternions, camera projection and back-projection (in the
conventions of :mod:`splat.conventions`: ``viewmat`` world -> camera,
OpenCV axes, pixel ``(i, j)`` covering ``[j, j+1) x [i, i+1)``), visibility
in a set of cameras, random points in a ball or in the cameras' frustums, and
nearest-neighbour spacing of a point cloud.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .conventions import pixel_centers_offset


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from (w, x, y, z) quaternions (normalised here).

    quats: [..., 4] -> [..., 3, 3]; column 2 is a surfel's normal.  Any
    finite, non-zero quaternion is normalised exactly; a zero one gives the
    identity.
    """
    # A row whose |q| is not a normal float32 (|q| >= 2e19 overflows to inf,
    # a tiny one underflows) is first divided by its largest component.  The
    # factor is held constant (detached): q / |q| does not depend on it, so
    # the gradient is that of q / |q|.  Every other row is divided by exactly
    # 1, so its rotation has the bits of q / max(|q|, 1e-12) (the trained
    # model's normals and split samples depend on them).
    norm = quats.detach().norm(dim=-1, keepdim=True)  # [..., 1]
    amax = quats.detach().abs().amax(dim=-1, keepdim=True)  # [..., 1]
    plain = (torch.isfinite(norm) & (norm >= 1e-12)) | (amax == 0)
    q = quats / torch.where(plain, torch.ones_like(amax), amax)
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    w, x, y, z = q.unbind(-1)
    R = torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    )
    return R.reshape(q.shape[:-1] + (3, 3))


def project_points(points: torch.Tensor, viewmats: torch.Tensor, Ks: torch.Tensor):
    """Pixel coordinates [C, M, 2] (conventions.py: pixel (i, j) covers
    [j, j+1) x [i, i+1)) and camera depths [C, M] of world points [M, 3] in
    cameras ``viewmats`` [C, 4, 4] (world -> camera) with intrinsics ``Ks`` [C, 3, 3]."""
    cam = torch.einsum("cij,mj->cmi", viewmats[:, :3, :3], points) + viewmats[:, None, :3, 3]
    z = cam[..., 2]
    uv = torch.einsum("cij,cmj->cmi", Ks, cam)
    return uv[..., :2] / z.clamp_min(1e-9)[..., None], z


def pixel_rays(K: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Camera-space rays with z = 1 through every pixel centre (conventions.py:
    pixel (i, j) has its centre at (j + 0.5, i + 0.5)), row-major: ray
    ``i * width + j``; ``ray * z`` is the point at camera depth z.  [H*W, 3]"""
    c = pixel_centers_offset()
    i, j = torch.meshgrid(
        torch.arange(height, dtype=K.dtype) + c, torch.arange(width, dtype=K.dtype) + c, indexing="ij"
    )
    uv1 = torch.stack([j, i, torch.ones_like(i)], -1).view(-1, 3)
    return uv1 @ torch.linalg.inv(K).T


def camera_to_world(viewmat: torch.Tensor, cam: torch.Tensor) -> torch.Tensor:
    """World points [M, 3] of camera-space points ``cam`` [M, 3] of the camera
    ``viewmat`` [4, 4] (world -> camera): ``R^T (cam - t)``."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    return (cam - t) @ R


def in_image(uv: torch.Tensor, z: torch.Tensor, widths, heights) -> torch.Tensor:
    """bool, shaped as ``z``: the projection ``uv`` [..., 2] (pixels) at camera
    depth ``z`` is in front of the camera and inside the image [0, W) x [0, H)
    (``widths``/``heights``: ints, or tensors broadcasting against ``z``)."""
    return (z > 1e-6) & (uv[..., 0] >= 0) & (uv[..., 0] < widths) & (uv[..., 1] >= 0) & (uv[..., 1] < heights)


def seen_by(points: torch.Tensor, viewmats: torch.Tensor, Ks: torch.Tensor, widths, heights) -> torch.Tensor:
    """[C, M] bool: point m is in front of camera c and inside its image
    (``widths``/``heights``: ints, or [C, 1] tensors for cameras of different sizes)."""
    # One camera at a time, into one preallocated result: the projections of
    # many points in all views at once are [C, M, 3] temporaries (0.5 GB for
    # 200k points in 60 views), and chunks of them fragment glibc's heap
    # (resident memory grew by 10 MB a chunk).  Per camera they are [M, 3].
    C, M = viewmats.shape[0], points.shape[0]
    out = torch.empty(C, M, dtype=torch.bool, device=points.device)
    w = torch.as_tensor(widths).reshape(-1).expand(C) if torch.is_tensor(widths) else [widths] * C
    h = torch.as_tensor(heights).reshape(-1).expand(C) if torch.is_tensor(heights) else [heights] * C
    for c in range(C):
        uv, z = project_points(points, viewmats[c : c + 1], Ks[c : c + 1])
        out[c] = in_image(uv[0], z[0], w[c], h[c])
    return out


def uniform_in_ball(
    n: int, center: torch.Tensor, radius: float, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """``n`` points uniform in the ball (``center`` [3], ``radius``): a uniform
    direction times ``radius * u^(1/3)``.  [n, 3]"""
    d = torch.randn(n, 3, generator=generator)
    d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return center[None] + d * (radius * torch.rand(n, 1, generator=generator) ** (1.0 / 3.0))


def random_points_in_frustums(
    n: int,
    viewmats: torch.Tensor,  # [C, 4, 4] world -> camera
    Ks: torch.Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    center: torch.Tensor,  # [3] scene centre
    radius: float,
    generator: Optional[torch.Generator] = None,
    min_views: float = 0.0,
    max_tries: int = 50,
) -> torch.Tensor:
    """``n`` points uniform in the ball (``center``, ``radius``) that are seen
    (in front of the camera and inside its image) by at least one camera and
    by at least a fraction ``min_views`` of the cameras.

    Rejection sampling; if the ball and the frustums barely overlap it falls
    back to unfiltered ball samples after ``max_tries`` rounds.  [n, 3]
    """
    kept = []
    total = 0
    for _ in range(max_tries):
        p = uniform_in_ball(max(2 * n, 1024), center, radius, generator)  # [m, 3]
        n_seen = seen_by(p, viewmats, Ks, width, height).sum(dim=0)  # [m]
        need = max(1, int(math.ceil(min_views * viewmats.shape[0])))
        p = p[n_seen >= need]
        kept.append(p)
        total += p.shape[0]
        if total >= n:
            break
    pts = torch.cat(kept, dim=0)
    if pts.shape[0] < n:  # frustums miss the ball: top up with plain ball samples
        pts = torch.cat([pts, uniform_in_ball(n - pts.shape[0], center, radius, generator)], dim=0)
    return pts[:n].contiguous()


def knn_mean_distance(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Mean distance from each point to its ``k`` nearest other points.

    points: [M, 3] -> [M].  A k-d tree (scipy's cKDTree, exact distances in
    float64): O(M log M), where all-pairs distances are O(M^2) and too slow
    for a large SfM cloud.
    """
    from scipy.spatial import cKDTree

    M = points.shape[0]
    if M <= 1:
        return torch.ones(M, dtype=points.dtype)
    k = min(k, M - 1)
    pts = points.detach().cpu().double().numpy()
    # k+1 nearest include the point itself (distance 0), dropped.  Duplicate
    # points are each other's neighbours at distance 0, as before.
    dist, _ = cKDTree(pts).query(pts, k=k + 1)
    return torch.from_numpy(dist[:, 1:].mean(axis=1)).to(points.dtype)
