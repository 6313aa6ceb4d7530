"""Meshing a whole unbounded scene, background included (2DGS's unbounded mode).

A bounded TSDF needs ``depth_trunc``: everything beyond it (a sky, a far
wall, an outdoor backdrop) is cut, or fused at a voxel far too fine for it.
Here space is first normalised by the cameras and contracted, as in
mip-NeRF 360,

    x' = (x - centre) / radius
    contract(x') = x'                          if |x'| <= 1
                 = (2 - 1/|x'|) x' / |x'|      otherwise,   so everything lies in |.| < 2,

and a regular grid of ``resolution``^3 samples is laid over the contracted
cube [-R, R]^3, R = the 95th percentile of the contracted surfel centres'
norms (plus 0.01, at most 1.9), as 2DGS does.  Each sample is mapped back
to the world (the inverse contraction, |x'| = 1 / (2 - |y|)), and its TSDF
is the mean over the views v that measure it,

    sdf_v = D_v(p) - z_v,  tsdf = clamp(sdf_v / trunc, -1, 1),  used where sdf_v > -trunc,

with a truncation that follows the sample's world-space voxel size, so that
it is a few voxels everywhere: trunc = TRUNC_VOXELS * radius * h * s, where
h = 2R / resolution and s = 1 inside the unit ball and (the radial stretch
of the inverse contraction) 1 / (2 - |y|)^2 outside.  2DGS uses one world
truncation for all samples, which is thinner than a voxel in the
background.  The zero level set (open3d's flying-edges marching cubes) is
mapped back to the world; crossings that touch a sample no view measured are
dropped (they are the edge of the truncation band, not a surface).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ..progress import use_progress_bar
from .open3d_import import import_open3d
from .views import FusionView, pixel_lookup

if TYPE_CHECKING:
    import open3d

#: Truncation in (local) voxels.
TRUNC_VOXELS = 5.0
#: Grid samples evaluated at once (bounds the working memory: ~100 bytes each).
SAMPLES_PER_CHUNK = 1 << 22


def contract(x: torch.Tensor) -> torch.Tensor:
    """mip-NeRF 360's contraction of normalised points. [..., 3] -> [..., 3]"""
    n = x.norm(dim=-1, keepdim=True)
    return torch.where(n <= 1.0, x, (2.0 - 1.0 / n.clamp_min(1e-12)) * x / n.clamp_min(1e-12))


def uncontract(y: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`contract` for |y| < 2. [..., 3] -> [..., 3]"""
    n = y.norm(dim=-1, keepdim=True)
    return torch.where(n <= 1.0, y, y / (n.clamp_min(1e-12) * (2.0 - n).clamp_min(1e-6)))


def radial_stretch(y: torch.Tensor) -> torch.Tensor:
    """d|x'|/d|y| of :func:`uncontract`: world length per contracted length. [..., 3] -> [...]"""
    n = y.norm(dim=-1)
    return torch.where(n <= 1.0, torch.ones_like(n), 1.0 / (2.0 - n).clamp_min(1e-6) ** 2)


def contracted_extent(points: torch.Tensor, center: torch.Tensor, radius: float) -> float:
    """R: the 95th percentile of the contracted norms of ``points`` [N, 3], + 0.01, at most 1.9."""
    if len(points) == 0:
        return 1.9
    n = contract((points.double() - center) / radius).norm(dim=-1)
    return float(min(float(torch.quantile(n, 0.95)) + 0.01, 1.9))


def unbounded_tsdf(
    views: Sequence[FusionView],
    center: torch.Tensor,
    radius: float,
    extent: float,
    resolution: int,
    progress: bool | str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tsdf [N, N, N], weight [N, N, N]) over the contracted cube [-extent, extent]^3,
    indexed [x, y, z] with sample i at -extent + (i + 0.5) * 2 extent / N."""
    n = int(resolution)
    h = 2.0 * extent / n
    axis = -extent + (torch.arange(n, dtype=torch.float32) + 0.5) * h  # [N]
    tsdf = torch.zeros(n * n * n, dtype=torch.float32)
    weight = torch.zeros(n * n * n, dtype=torch.float32)
    cams = [
        (torch.from_numpy(v.viewmat).float(), torch.from_numpy(v.K).float(), torch.from_numpy(v.depth).float())
        for v in views
    ]
    starts = range(0, n * n * n, SAMPLES_PER_CHUNK)
    if use_progress_bar(progress):
        from tqdm import tqdm

        starts = tqdm(starts, desc="unbounded TSDF", dynamic_ncols=True)
    center = center.float()
    for start in starts:
        idx = torch.arange(start, min(start + SAMPLES_PER_CHUNK, n * n * n))
        y = torch.stack([axis[idx // (n * n)], axis[(idx // n) % n], axis[idx % n]], -1)  # [m, 3]
        world = uncontract(y) * radius + center  # [m, 3]
        trunc = TRUNC_VOXELS * radius * h * radial_stretch(y)  # [m]
        acc, cnt = torch.zeros(len(idx)), torch.zeros(len(idx))
        for viewmat, K, depth in cams:
            H, W = depth.shape
            z, inside, pixel = pixel_lookup(world, viewmat, K, H, W)
            d = torch.zeros_like(z)
            d[inside] = depth.reshape(-1)[pixel]
            sdf = d - z
            use = inside & (d > 0) & (sdf > -trunc)
            acc += torch.where(use, (sdf / trunc).clamp(-1.0, 1.0), torch.zeros_like(sdf))
            cnt += use.float()
        tsdf[idx] = torch.where(cnt > 0, acc / cnt.clamp_min(1.0), torch.ones_like(acc))
        weight[idx] = cnt
    return tsdf.view(n, n, n), weight.view(n, n, n)


def extract_unbounded(
    views: Sequence[FusionView],
    center: torch.Tensor,
    radius: float,
    extent: float,
    resolution: int = 512,
    progress: bool | str = "auto",
) -> open3d.geometry.TriangleMesh:
    """The contracted-space TSDF's zero level set in world coordinates: an open3d
    legacy TriangleMesh, without colours (see :func:`splat.mesh.color_vertices`)."""
    o3d = import_open3d()
    tsdf, weight = unbounded_tsdf(views, center, radius, extent, resolution, progress)
    n = int(resolution)
    h = 2.0 * extent / n
    # create_isosurfaces reads volume[z, y, x] as the sample at (x, y, z)
    iso = o3d.t.geometry.TriangleMesh.create_isosurfaces(
        o3d.core.Tensor(np.ascontiguousarray(tsdf.permute(2, 1, 0).numpy())), [0.0]
    )
    if iso.vertex.positions.shape[0] == 0:
        return o3d.geometry.TriangleMesh()
    grid_pos = torch.from_numpy(iso.vertex.positions.numpy()).double()  # [M, 3] in sample units
    tris = torch.from_numpy(iso.triangle.indices.numpy()).long()  # [T, 3]
    # A vertex lies on the edge between two samples: both must be measured.
    lo = torch.floor(grid_pos).long().clamp(0, n - 1)
    hi = torch.ceil(grid_pos).long().clamp(0, n - 1)
    measured = (weight[lo[:, 0], lo[:, 1], lo[:, 2]] > 0) & (weight[hi[:, 0], hi[:, 1], hi[:, 2]] > 0)
    y = -extent + (grid_pos + 0.5) * h
    world = uncontract(y) * radius + center.double()
    # Flying edges winds the triangles with their normals towards increasing
    # values, i.e. into the surface here (free space is tsdf > 0); reverse
    # them so that normals face the cameras, as in the bounded meshes.
    tris = tris[:, [0, 2, 1]]
    mesh = o3d.geometry.TriangleMesh(
        o3d.utility.Vector3dVector(world.numpy()), o3d.utility.Vector3iVector(tris.numpy().astype(np.int32))
    )
    mesh.remove_triangles_by_mask(~measured.numpy()[tris.numpy()].all(axis=1))
    mesh.remove_unreferenced_vertices()
    return mesh
