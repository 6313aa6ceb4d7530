"""Meshing (splat.mesh) on fixtures whose surface is known exactly.

A unit sphere of opaque surfels seen by 24 cameras is rendered with splat's
own rasterizer and meshed.  Broken fusion (a wrong camera convention, a lost
view, the pixel-centre offset forgotten, a sign error in the TSDF) moves the
surface by a voxel or more or leaves holes, so the bounds below (a fraction of
a voxel on average, complete coverage) fail on it; see each test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import splat
from splat.geometry import pixel_rays
from splat.mesh.open3d_import import explain_import_error, missing_library
from splat.mesh.views import FusionView, fused_depth
from splat.testing import look_at_viewmat, quats_from_normals

SIZE = 96
N_VIEWS = 24


def fibonacci_sphere(n: int) -> torch.Tensor:
    """n nearly evenly spaced unit vectors. [n, 3]"""
    i = torch.arange(n, dtype=torch.float64) + 0.5
    phi = torch.acos(1 - 2 * i / n)
    theta = math.pi * (1 + 5**0.5) * i
    return torch.stack([torch.cos(theta) * torch.sin(phi), torch.sin(theta) * torch.sin(phi), torch.cos(phi)], -1)


def sphere_model(n: int = 6000, radius: float = 1.0, inward: bool = False):
    """Opaque surfels tiling a sphere at the origin: (means, quats, scales, opacities, colours)."""
    d = fibonacci_sphere(n)
    spacing = radius * math.sqrt(4 * math.pi / n)
    g = torch.Generator().manual_seed(0)
    normals = -d if inward else d
    colors = 0.5 + 0.4 * d  # a colour that varies over the sphere, to check the mesh's colours
    return (
        d * radius,
        quats_from_normals(normals, g),
        torch.full((n, 2), 0.8 * spacing, dtype=torch.float64),
        torch.full((n,), 0.99, dtype=torch.float64),
        colors,
    )


def ring_cameras(distance: float = 3.5):
    """24 cameras on three rings around the origin and two above the poles: [(viewmat [4,4], K [3,3])]."""
    f = SIZE / (2 * math.tan(math.radians(45.0) / 2))
    K = torch.tensor([[f, 0, SIZE / 2], [0, f, SIZE / 2], [0, 0, 1]], dtype=torch.float64)
    cams = []
    for k in range(N_VIEWS):
        az = 2 * math.pi * k / 8 + (k // 8) * 0.3
        el = (k // 8 - 1) * 0.6
        eye = distance * torch.tensor([math.cos(el) * math.cos(az), math.sin(el), math.cos(el) * math.sin(az)])
        cams.append((look_at_viewmat(eye.tolist(), (0.0, 0.0, 0.0)), K))
    for pole in (1.0, -1.0):  # the poles, which the rings see only at grazing angles
        cams.append((look_at_viewmat((0.0, pole * distance, 0.0), (0.0, 0.0, 0.0), up=(1.0, 0.0, 0.0)), K))
    return cams


def render_views(models, cams, min_cos=0.3, depth_ratio=0.0):
    """FusionViews of the surfels ``models`` in ``cams``.  Pixels whose ray meets
    the surface at more than acos(min_cos) from its normal are left out: there
    the tangent discs of a sphere stick out past it, so the rendered depth is
    too near by up to 0.06, and fusion would inherit that error; elsewhere the
    median error is under 1e-3, so the tests below measure the fusion alone."""
    means, quats, scales, opac, colors = (torch.cat(parts) for parts in zip(*models))
    views = []
    for viewmat, K in cams:
        out = splat.rasterize(
            means.float(),
            quats.float(),
            scales.float(),
            opac.float(),
            colors.float(),
            viewmat.float(),
            K.float(),
            SIZE,
            SIZE,
            far=1000.0,
            backend="cpu",
        )
        z = fused_depth(out.depth, out.median_depth, out.alpha, depth_ratio, 0.5)
        rays = pixel_rays(K.float(), SIZE, SIZE).view(SIZE, SIZE, 3) @ viewmat[:3, :3].float()  # world [H, W, 3]
        cos = torch.nn.functional.cosine_similarity(out.normal, rays, dim=-1).abs()
        z = torch.where(cos >= min_cos, z, torch.zeros_like(z))
        views.append(FusionView(rgb=out.rgb.numpy(), depth=z.numpy(), K=K.numpy(), viewmat=viewmat.numpy()))
    return views


@pytest.fixture(scope="module")
def sphere_views():
    return render_views([sphere_model()], ring_cameras())


def test_import_error_names_the_library_and_the_package():
    err = OSError("libusb-1.0.so.0: cannot open shared object file: No such file or directory")
    assert missing_library(str(err)) == "libusb-1.0.so.0"
    msg = explain_import_error(err)
    assert "libusb-1.0.so.0" in msg and "apt-get install libusb-1.0-0" in msg and "\n" not in msg
    msg = explain_import_error(ImportError("libGL.so.1: cannot open shared object file: No such file"))
    assert "apt-get install libgl1" in msg
    assert "pip install open3d-cpu" in explain_import_error(ModuleNotFoundError("No module named 'open3d'"))


def test_fused_depth_mixes_and_cuts():
    e = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.tensor([[2.0, 2.0], [1.0, 8.0]])
    a = torch.tensor([[0.9, 0.4], [0.5, 1.0]])
    z = fused_depth(e, m, a, 0.25, 0.5)
    assert torch.equal(z, torch.tensor([[1.25, 0.0], [2.5, 5.0]]))
    with pytest.raises(ValueError, match="depth_ratio"):
        fused_depth(e, m, a, 1.5, 0.5)


def test_tsdf_sphere_is_accurate_complete_and_coloured(sphere_views):
    """The vertices' mean r - 1 under 0.25 voxel, mean |r - 1| under 0.3 voxel
    and none beyond 1.5 voxels; every direction of the sphere within 1.5 voxels of a
    vertex (no holes).  The fused depth is exact to ~1e-3 (render_views), so
    the bounds measure the fusion."""
    pytest.importorskip("open3d")
    from splat.mesh import fuse_tsdf, keep_large_clusters, remove_unseen

    voxel = 0.02
    mesh = fuse_tsdf(sphere_views, voxel, 5 * voxel, 6.0, progress=False)
    mesh, removed = remove_unseen(mesh, sphere_views, 2.5 * voxel)
    mesh, clusters = keep_large_clusters(mesh, 50)  # as extract_mesh does: a 1-triangle fragment goes
    assert clusters == 1
    v = np.asarray(mesh.vertices)
    assert len(v) > 10000
    r = np.linalg.norm(v, axis=1)
    assert abs((r - 1).mean()) < 0.25 * voxel, (r - 1).mean()  # little bias (measured 0.14 voxel)
    assert np.abs(r - 1).mean() < 0.35 * voxel, np.abs(r - 1).mean()  # little scatter (measured 0.23)
    assert np.abs(r - 1).max() < 1.5 * voxel, np.abs(r - 1).max()
    assert removed < 0.01  # nothing hidden on a sphere seen from all round
    probe = fibonacci_sphere(2000).numpy()
    from scipy.spatial import cKDTree

    gap, _ = cKDTree(v).query(probe)
    assert gap.max() < 1.5 * voxel, gap.max()
    mesh.compute_vertex_normals()  # facing the cameras, i.e. out of the sphere
    assert ((np.asarray(mesh.vertex_normals) * v).sum(1) > 0).mean() > 0.99
    # vertex colours: the surfels' colour field 0.5 + 0.4 d, seen through the views' pixels
    c = np.asarray(mesh.vertex_colors)
    expected = 0.5 + 0.4 * v / r[:, None]
    assert np.abs(c - expected).mean() < 0.02, np.abs(c - expected).mean()  # measured 0.004


def test_tsdf_follows_splat_pixel_centres():
    """One view of a plane tilted 60 degrees, its depth computed exactly through
    splat's pixel centres: the fused vertices lie on the plane without bias
    (mean signed distance under 0.2 voxel; measured 0.05).  A half-pixel
    error in the camera convention handed to open3d biases them by 0.8 voxel
    (measured with the principal point shifted by -0.5 and by +0.5)."""
    pytest.importorskip("open3d")
    from splat.mesh import fuse_tsdf

    f = SIZE / (2 * math.tan(math.radians(45.0) / 2))
    K = torch.tensor([[f, 0, SIZE / 2 + 7.3], [0, f, SIZE / 2 - 4.1], [0, 0, 1]], dtype=torch.float64)
    normal = torch.tensor([math.sin(math.radians(60)), 0.0, -math.cos(math.radians(60))], dtype=torch.float64)
    offset = float(normal @ torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64))  # plane: normal . x = offset
    rays = pixel_rays(K, SIZE, SIZE)  # [H*W, 3], z = 1
    depth = (offset / (rays @ normal)).view(SIZE, SIZE)  # camera z of the plane through each pixel centre
    depth = torch.where((depth > 0) & (depth < 4), depth, torch.zeros_like(depth))
    view = FusionView(
        rgb=np.full((SIZE, SIZE, 3), 0.5, np.float32), depth=depth.float().numpy(), K=K.numpy(), viewmat=np.eye(4)
    )
    voxel = 0.01
    mesh = fuse_tsdf([view], voxel, 5 * voxel, 4.0, progress=False)
    v = np.asarray(mesh.vertices)
    assert len(v) > 1000
    signed = v @ normal.numpy() - offset
    assert abs(signed.mean()) < 0.2 * voxel, signed.mean() / voxel


def test_unseen_surfaces_are_removed(sphere_views):
    """A sheet inside the opaque sphere (as fusion builds from depth rendered
    too far) is removed, and so is one in front of every view's surface; the
    sphere itself is kept."""
    o3d = pytest.importorskip("open3d")
    from splat.mesh import keep_large_clusters, remove_unseen

    outer = o3d.geometry.TriangleMesh.create_sphere(radius=1.0, resolution=40)
    inner = o3d.geometry.TriangleMesh.create_sphere(radius=0.8, resolution=40)
    mesh = outer + inner
    area_outer = outer.get_surface_area()
    mesh, removed = remove_unseen(mesh, sphere_views, 0.05)
    share_inner = inner.get_surface_area() / (area_outer + inner.get_surface_area())
    # the icosphere's flat faces lie up to ~0.003 inside the unit sphere: well within the tolerance
    assert abs(removed - share_inner) < 0.01, (removed, share_inner)
    assert np.linalg.norm(np.asarray(mesh.vertices), axis=1).min() > 0.95
    # A shell 0.2 outside the sphere lies in front of every view's surface
    # (a fused average where no view put one): no view measured it, it goes;
    # one at 0.03 is within the tolerance of the measured surface and stays.
    for radius, kept_share in ((1.2, 0.0), (1.03, 1.0)):
        shell = o3d.geometry.TriangleMesh.create_sphere(radius=radius, resolution=40)
        both, removed = remove_unseen(outer + shell, sphere_views, 0.05)
        share_shell = shell.get_surface_area() / (area_outer + shell.get_surface_area())
        assert abs(removed - (1.0 - kept_share) * share_shell) < 0.01, (radius, removed, share_shell)
    # a few stray triangles far from everything form small clusters and go
    stray = o3d.geometry.TriangleMesh.create_tetrahedron(radius=0.05).translate((0.0, 0.0, 0.5))
    mesh2, kept = keep_large_clusters(outer + stray, min_triangles=50)
    assert kept == 1 and len(mesh2.triangles) == len(outer.triangles)


def test_unbounded_meshes_the_background_too():
    """A unit sphere inside a far backdrop (an inward-facing sphere of radius
    12), fused from the median depth as extract_mesh does for unbounded
    scenes: the extraction keeps both, each within a fraction of its local
    voxel (contracted space is coarse far out), and nothing in the free space
    between them.  With the expected depth instead, the sphere's silhouette
    pixels mix both depths and build ~18k vertices of sheets in between."""
    pytest.importorskip("open3d")
    from splat.mesh import extract_unbounded, keep_large_clusters, remove_unseen
    from splat.mesh.unbounded import contract, radial_stretch

    cams = ring_cameras()
    views = render_views([sphere_model(), sphere_model(20000, 12.0, inward=True)], cams, depth_ratio=1.0)
    center, radius, extent, res = torch.zeros(3, dtype=torch.float64), 3.5 * 1.1, 1.9, 160
    mesh = extract_unbounded(views, center, radius, extent, res, progress=False)

    def local_voxel(vertices):  # world size of a contracted voxel at each vertex [M]
        y = contract(torch.from_numpy(np.asarray(vertices)) / radius)
        return (radius * 2 * extent / res * radial_stretch(y)).numpy()

    mesh, removed = remove_unseen(mesh, views, 2.5 * local_voxel(mesh.vertices))
    mesh, _ = keep_large_clusters(mesh, 50)
    v = np.asarray(mesh.vertices)
    r = np.linalg.norm(v, axis=1)
    near, far = r < 2.0, r > 6.0
    assert near.sum() > 1000 and far.sum() > 10000
    assert not ((r > 1.2) & (r < 11.0)).any(), np.sort(r[(r > 1.2) & (r < 11.0)])[:10]  # no flying sheets
    local = local_voxel(v)
    assert (np.abs(r[near] - 1) / local[near]).mean() < 0.3, (np.abs(r[near] - 1) / local[near]).mean()
    assert (np.abs(r[far] - 12) / local[far]).mean() < 0.3, (np.abs(r[far] - 12) / local[far]).mean()
    # normals face the cameras: out of the sphere, into the backdrop
    mesh.compute_vertex_normals()
    outward = (np.asarray(mesh.vertex_normals) * v).sum(1) > 0
    assert outward[near].mean() > 0.95 and (~outward[far]).mean() > 0.95
    # what lies beyond the backdrop (the truncation band's far edge) is behind every view: removed
    assert r.max() < 12 + local.max(), r.max()
    assert 0.0 < removed < 0.05
