"""Mesh clean-up after extraction: surfaces no view sees, and small fragments.

Unseen surfaces.  TSDF fusion marks a zero crossing wherever some view's
depth ends, including depth rendered too far (through a thin floor, past a
silhouette).  Such a sheet lies *behind* what every camera observes, so no
image can confirm it, yet it is part of the mesh that is printed, simulated
or measured.  Where the views disagree (a model's depth is off at grazing
angles, at the foot of an object), the fused surface is their average and
can lie where no view put a surface: in front of some, behind others.  A
vertex x is kept if at least one view v measured a surface at it:

    x is in front of v, projects inside its image at pixel p,
    D_v(p) > 0 (a measurement), and |z_v(x) - D_v(p)| <= tolerance,

with D_v the view's front depth (views.py: the nearer of expected and
median), and a triangle is kept if its three vertices are.  ``tolerance``
absorbs the fusion's own scatter around each view's depth (on the sphere of
tests/test_mesh.py: at most a voxel).

Requiring the vertex *on* some view's surface, not merely not behind it,
removed a further 6 % of the fast config's still_life mesh and lowered the
share no camera sees from 5.3 % to 4.7 % with F1 up from 0.878 to 0.882
(default config: 3.2 % to 3.1 %, F1 0.943 to 0.948; ``bench/mesh.py``).

Fragments.  As 2DGS's ``post_process_mesh``: connected components of
triangles below ``min_triangles`` are dropped; 2DGS keeps the 1000 largest
clusters (and at least 50 triangles each) by default, ``max_clusters`` does
the same here when given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

from .open3d_import import import_open3d
from .views import FusionView, pixel_lookup

if TYPE_CHECKING:
    import open3d

#: Vertices projected at once per view (bounds the working memory).
SEEN_CHUNK = 1 << 20


def observe_vertices(
    vertices: np.ndarray, views: Sequence[FusionView], tolerance: float | np.ndarray, with_color: bool = False
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Which vertices the views see (module doc), and optionally their colour.

    vertices [M, 3]; tolerance: a float or [M] per vertex.  Returns
    (seen [M] bool, colour [M, 3] float in [0, 1] or None): the colour is the
    mean of the views' pixels where the vertex lies on the measured surface
    (|z - D| <= tolerance), mid-grey where it lies on none."""
    verts = torch.from_numpy(np.ascontiguousarray(vertices, dtype=np.float64))
    tol = torch.as_tensor(tolerance, dtype=torch.float64).expand(len(verts))
    seen = torch.zeros(len(verts), dtype=torch.bool)
    color_sum = torch.zeros(len(verts), 3, dtype=torch.float64) if with_color else None
    color_cnt = torch.zeros(len(verts), dtype=torch.float64) if with_color else None
    for v in views:
        depth = torch.from_numpy(v.visibility_depth).double().reshape(-1)  # [H*W]
        rgb = torch.from_numpy(v.rgb).double().reshape(-1, 3) if with_color else None  # [H*W, 3]
        viewmat, K = torch.from_numpy(v.viewmat), torch.from_numpy(v.K)
        # Without colours a vertex that one view saw needs no other view.
        todo = torch.arange(len(verts)) if with_color else torch.nonzero(~seen).view(-1)
        for idx in todo.split(SEEN_CHUNK):
            z, inside, pixel = pixel_lookup(verts[idx], viewmat, K, v.height, v.width)
            d = torch.zeros_like(z)
            d[inside] = depth[pixel]
            on_surface = inside & (d > 0) & ((z - d).abs() <= tol[idx])
            seen[idx] |= on_surface
            if with_color:
                c = torch.zeros(len(z), 3, dtype=torch.float64)
                c[inside] = rgb[pixel]
                color_sum[idx] += c * on_surface[:, None]
                color_cnt[idx] += on_surface.double()
    color = None
    if with_color:
        color = torch.where(
            color_cnt[:, None] > 0, color_sum / color_cnt.clamp_min(1.0)[:, None], torch.full_like(color_sum, 0.5)
        ).numpy()
    return seen.numpy(), color


def remove_unseen(
    mesh: open3d.geometry.TriangleMesh,
    views: Sequence[FusionView],
    tolerance: float | np.ndarray,
    recolor: bool = False,
) -> tuple[open3d.geometry.TriangleMesh, float]:
    """Drop the triangles with a vertex no view sees; returns (mesh, share of the
    area removed).  ``mesh`` is an open3d legacy TriangleMesh, changed in place;
    ``recolor`` also sets its vertex colours from the views (:func:`observe_vertices`).
    tolerance: a float, or [M] per vertex."""
    if len(mesh.triangles) == 0:
        return mesh, 0.0
    area_before = mesh.get_surface_area()
    seen, color = observe_vertices(np.asarray(mesh.vertices), views, tolerance, with_color=recolor)
    if recolor:
        mesh.vertex_colors = import_open3d().utility.Vector3dVector(color)
    tris = np.asarray(mesh.triangles)
    mesh.remove_triangles_by_mask(~seen[tris].all(axis=1))
    mesh.remove_unreferenced_vertices()
    removed = 1.0 - mesh.get_surface_area() / area_before if area_before > 0 else 0.0
    return mesh, float(removed)


def keep_large_clusters(
    mesh: open3d.geometry.TriangleMesh, min_triangles: int = 50, max_clusters: Optional[int] = None
) -> tuple[open3d.geometry.TriangleMesh, int]:
    """Drop connected components with fewer than ``min_triangles`` triangles,
    and all but the ``max_clusters`` largest when given; returns (mesh,
    number of clusters kept).  Changed in place."""
    if len(mesh.triangles) == 0:
        return mesh, 0
    labels, counts, _ = mesh.cluster_connected_triangles()
    labels, counts = np.asarray(labels), np.asarray(counts)
    keep = counts >= int(min_triangles)
    if max_clusters is not None and keep.sum() > max_clusters:
        order = np.argsort(-counts)
        keep[order[int(max_clusters) :]] = False
    mesh.remove_triangles_by_mask(~keep[labels])
    mesh.remove_unreferenced_vertices()
    return mesh, int(keep.sum())
