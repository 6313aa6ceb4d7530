"""Multi-view consistency (splat/multiview.py, splat/neighbour_views.py, issue 41):
neighbour selection, plane homographies on an analytic plane, NCC, float64
gradients through small renders of both primitives, and a two-view scene
where the terms move a surface that photometry alone leaves wrong."""

from __future__ import annotations

import math

import pytest
import torch

from splat import rasterize, rasterize_3dgs
from splat.geometry import pixel_rays
from splat.multiview import (
    ViewGeometry,
    apply_homography,
    camera_planes,
    forward_backward_error,
    grey,
    multiview_losses,
    ncc,
    patch_offsets,
    pixel_centres,
    plane_homography,
    project,
    rays_through,
    relative_pose,
)
from splat.neighbour_views import lonely_cameras_message, neighbour_views
from splat.testing import intrinsics, look_at_viewmat

D = torch.float64


# ------------------------------------------------------------------ neighbours
def ring_viewmats(n: int, radius: float = 3.0) -> torch.Tensor:
    """n cameras on a horizontal ring looking at the origin: neighbours 360/n degrees apart."""
    eyes = [(radius * math.cos(2 * math.pi * k / n), 0.0, radius * math.sin(2 * math.pi * k / n)) for k in range(n)]
    return torch.stack([look_at_viewmat(e, (0.0, 0.0, 0.0)) for e in eyes])


def test_neighbours_within_angle_and_distance_nearest_first():
    V = ring_viewmats(12)  # 30 degrees apart; chords: 1.55 to the next camera, 3.0 to the second
    assert neighbour_views(V, max_angle_deg=29.0, max_distance=10.0) == [[] for _ in range(12)]
    got = neighbour_views(V, max_angle_deg=61.0, max_distance=10.0)
    for i, nb in enumerate(got):
        # nearest first: the +-30 deg cameras, then the +-60 deg ones (equal up to rounding: any order)
        assert sorted(nb[:2]) == sorted([(i + 1) % 12, (i - 1) % 12])
        assert sorted(nb[2:]) == sorted([(i + 2) % 12, (i - 2) % 12])
    band = neighbour_views(V, max_angle_deg=61.0, min_distance=1.6, max_distance=10.0)
    assert [sorted(nb) for nb in band] == [sorted([(i + 2) % 12, (i - 2) % 12]) for i in range(12)]
    near = neighbour_views(V, max_angle_deg=61.0, max_distance=1.6)
    assert [sorted(nb) for nb in near] == [sorted([(i + 1) % 12, (i - 1) % 12]) for i in range(12)]
    assert neighbour_views(V, max_angle_deg=61.0, max_distance=10.0, max_count=1) == [[nb[0]] for nb in got]


def test_neighbours_skip_same_place_and_opposite_direction():
    V = ring_viewmats(4)
    twin = V[0].clone()  # same centre and direction: distance 0 is below min_distance
    got = neighbour_views(torch.cat([V, twin[None]]), max_angle_deg=100.0, max_distance=10.0)
    assert 4 not in got[0] and 0 not in got[4]
    assert 2 not in got[0]  # the opposite camera looks the other way (180 deg)


def test_lonely_cameras_message_names_them():
    msg = lonely_cameras_message(["a.png", "b.png", "c.png"], [[1], [], []], "30 deg")
    assert msg.count("\n") == 0 and "b.png, c.png" in msg and "2 of 3" in msg
    assert lonely_cameras_message(["a", "b"], [[1], [0]], "x") is None


# ------------------------------------------------------------ analytic plane
def two_cameras():
    K1 = intrinsics(64, 48, 55.0)
    K2 = intrinsics(64, 48, 48.0, principal_offset=(1.5, -2.0))
    V1 = look_at_viewmat((0.3, -0.2, -4.0), (0.0, 0.0, 0.0))
    V2 = look_at_viewmat((1.4, -0.6, -3.6), (0.1, 0.1, 0.0))
    return K1, V1, K2, V2


def analytic_plane(normal_world, point_world, K, V, H=48, W=64):
    """The exact depth [H, W] and normal map [H, W, 3] of the world plane through point_world."""
    n = torch.tensor(normal_world, dtype=D)
    n = n / n.norm()
    p0 = torch.tensor(point_world, dtype=D)
    R, t = V[:3, :3], V[:3, 3]
    nc, p0c = R @ n, R @ p0 + t
    rays = rays_through(pixel_centres(H, W, D), K)  # [H, W, 3]
    depth = (nc @ p0c) / (rays @ nc)  # [H, W]: ray z such that z ray lies on the plane
    facing = -n if float(nc @ p0c) > 0 else n  # the rendered normal faces the camera
    return depth, facing.expand(H, W, 3).clone()


PLANE = ((0.2, -0.3, -1.0), (0.1, 0.05, 0.3))


@pytest.mark.parametrize("direction", ["1->2", "2->1"])
def test_homography_is_exact_on_an_analytic_plane(direction):
    K1, V1, K2, V2 = two_cameras()
    if direction == "2->1":
        K1, V1, K2, V2 = K2, V2, K1, V1
    depth, normal = analytic_plane(*PLANE, K1, V1)
    X, n, d = camera_planes(depth, normal, K1, V1)
    R, t = relative_pose(V1, V2)
    Hm = plane_homography(K1, K2, R, t, n.reshape(-1, 3), d.reshape(-1))
    pix = pixel_centres(48, 64, D).reshape(-1, 1, 2)
    q = apply_homography(Hm, pix)[:, 0]
    expected = project(X.reshape(-1, 3) @ R.T + t, K2)  # the surface point seen by camera 2
    assert torch.allclose(q, expected, atol=1e-9)  # float64 rounding of ~1e2-pixel coordinates
    # A patch around each pixel maps to where camera 2 sees those plane points.
    offs = patch_offsets(7, D)
    qp = apply_homography(Hm[:50], pix[:50] + offs[None])
    nc0, d0 = n.reshape(-1, 3)[0], d.reshape(-1)[0]  # one plane: the same for every pixel
    rays = rays_through(pix[:50] + offs[None], K1)
    Y = rays * (-d0 / (rays @ nc0))[..., None]  # the plane's points on the offset pixels' rays
    assert torch.allclose(qp, project(Y @ R.T + t, K2), atol=1e-9)
    # Back again: the homography of camera 2's view of the same plane inverts it.
    depth2, normal2 = analytic_plane(*PLANE, K2, V2)
    _, n2, d2 = camera_planes(depth2, normal2, K2, V2)
    R2, t2 = relative_pose(V2, V1)
    H21 = plane_homography(
        K2, K1, R2, t2, n2.reshape(-1, 3)[:1].expand(Hm.shape[0], 3), d2.reshape(-1)[:1].expand(Hm.shape[0])
    )
    back = apply_homography(H21, q[:, None])[:, 0]
    assert torch.allclose(back, pix[:, 0], atol=1e-9)


@pytest.mark.parametrize("direction", ["1->2", "2->1"])
def test_forward_backward_error_zero_on_the_plane_and_measures_a_shift(direction):
    K1, V1, K2, V2 = two_cameras()
    if direction == "2->1":
        K1, V1, K2, V2 = K2, V2, K1, V1
    d1, n1 = analytic_plane(*PLANE, K1, V1)
    d2, _ = analytic_plane(*PLANE, K2, V2)
    X, _, _ = camera_planes(d1, n1, K1, V1)
    R, t = relative_pose(V1, V2)
    pix = pixel_centres(48, 64, D).reshape(-1, 2)
    err, valid = forward_backward_error(X.reshape(-1, 3), pix, K1, K2, R, t, d2)
    # Bilinear sampling of the neighbour's depth is exact only where the depth is
    # affine in the pixel: 1/z is affine on a plane, z is not, so z's curvature
    # over a pixel leaves a small error (~1e-3 px here).
    assert valid.sum() > 500 and float(err[valid].max()) < 5e-3
    # The reference surface 5 % farther: the error is the analytic reprojection of that shift.
    err2, valid2 = forward_backward_error(1.05 * X.reshape(-1, 3), pix, K1, K2, R, t, d2)
    assert float(err2[valid2].mean()) > 0.3


def test_forward_backward_error_reads_a_neighbour_depth_rendered_at_half_size():
    """``loss.multiview.neighbour_downscale=2``: camera 2's depth at 32 x 24
    (K halved) looked up at camera 2's full-size pixels scaled by 1/2 (exact
    with pixel centres at j + 0.5): zero on the plane to bilinear accuracy
    at the coarser pixels (~4x the full-size curvature error, see above);
    the same 5 % shift measured within 2 % of the full-size figure."""
    K1, V1, K2, V2 = two_cameras()
    d1, n1 = analytic_plane(*PLANE, K1, V1)
    K2h = K2.clone()
    K2h[:2] /= 2
    d2h, _ = analytic_plane(*PLANE, K2h, V2, H=24, W=32)
    d2, _ = analytic_plane(*PLANE, K2, V2)
    X, _, _ = camera_planes(d1, n1, K1, V1)
    R, t = relative_pose(V1, V2)
    pix = pixel_centres(48, 64, D).reshape(-1, 2)
    err, valid = forward_backward_error(X.reshape(-1, 3), pix, K1, K2, R, t, d2h, (48, 64))
    assert valid.sum() > 500 and float(err[valid].max()) < 2e-2
    shifted = [forward_backward_error(1.05 * X.reshape(-1, 3), pix, K1, K2, R, t, dm, (48, 64)) for dm in (d2h, d2)]
    both = shifted[0][1] & shifted[1][1]
    half, full = (float(e[both].mean()) for e, _ in shifted)
    assert full > 0.3 and abs(half - full) < 0.02 * full
    # Looked up without the scale (the half-size map read at full-size pixels): ~1 px off, 50x the above.
    wrong, ok = forward_backward_error(X.reshape(-1, 3), pix, K1, K2, R, t, d2h)
    assert float(wrong[ok].mean()) > 0.5


def test_ncc_of_a_patch_with_itself_and_a_shifted_copy():
    g = torch.Generator().manual_seed(0)
    img = torch.rand(40, 40, generator=g, dtype=D)
    a = img[10:17, 10:17].reshape(1, -1)
    assert torch.allclose(ncc(a, a), torch.ones(1, dtype=D), atol=1e-9)
    assert torch.allclose(ncc(a, 3 * a + 0.2), torch.ones(1, dtype=D), atol=1e-9)  # gain and offset blind
    assert torch.allclose(ncc(a, -a), -torch.ones(1, dtype=D), atol=1e-9)
    shifted = img[10:17, 11:18].reshape(1, -1)  # the patch one pixel right: uncorrelated noise
    assert float(ncc(a, shifted)) < 0.5
    smooth = torch.linspace(0, 1, 40, dtype=D)[None].expand(40, 40) ** 2  # a smooth ramp: a shift stays similar
    s0, s1 = smooth[5:12, 5:12].reshape(1, -1), smooth[5:12, 6:13].reshape(1, -1)
    assert 0.9 < float(ncc(s0, s1)) < 1.0


# ------------------------------------------------------------- through renders
def small_pair(primitive: str):
    """A dense little scene seen by two cameras 17 x 13 px: most pixels covered."""
    g = torch.Generator().manual_seed(4)
    n = 24
    means = (torch.rand(n, 3, generator=g, dtype=D) * 2 - 1) * torch.tensor([0.9, 0.7, 0.25], dtype=D)
    quats = torch.randn(n, 4, generator=g, dtype=D)
    scales = torch.rand(n, 3 if primitive == "3dgs" else 2, generator=g, dtype=D) * 0.25 + 0.3
    opac = torch.rand(n, generator=g, dtype=D) * 0.3 + 0.65
    cols = torch.rand(n, 3, generator=g, dtype=D)
    K = intrinsics(17, 13, 50.0)
    V1 = look_at_viewmat((0.2, -0.1, -3.0), (0.0, 0.0, 0.0))
    V2 = look_at_viewmat((0.7, -0.3, -2.9), (0.0, 0.0, 0.0))
    return means, quats, scales, opac, cols, K, V1, V2


def render_geometry(primitive, means, quats, scales, opac, cols, K, V):
    fn = rasterize_3dgs if primitive == "3dgs" else rasterize
    out = fn(means, quats, scales, opac, cols, V, K, 17, 13)
    return out, ViewGeometry(out.depth, out.normal, out.alpha, K, V)


@pytest.mark.parametrize("primitive, geo_pixels", [("2dgs", 0), ("3dgs", 0), ("2dgs", 120)])
def test_multiview_loss_gradients_float64(primitive, geo_pixels):
    """Central differences (torch.autograd.gradcheck, h = 1e-6) of L_geo + L_ncc
    with respect to the means and scales, the weights w held at this scene's
    values (they carry no gradient by design; with them recomputed the check
    fails, by up to 0.28).  The masks are discrete; this fixed scene has no
    pixel within h of a threshold (the counts stay the same under every
    perturbation), so the loss is smooth there; tolerances as
    tests/test_finite_differences.py (h = 1e-6 in float64).  ``geo_pixels``
    120: the geometric term on a random subset of the covered pixels (the
    gathered path)."""
    means, quats, scales, opac, cols, K, V1, V2 = small_pair(primitive)
    with torch.no_grad():
        o1, _ = render_geometry(primitive, means, quats, scales, opac, cols, K, V1)
        o2, _ = render_geometry(primitive, means * 1.02, quats, scales, opac, cols, K, V2)  # photos of another shape
    grey1 = (o1.rgb @ torch.tensor([0.299, 0.587, 0.114], dtype=D))[..., None]
    grey2 = (o2.rgb @ torch.tensor([0.299, 0.587, 0.114], dtype=D))[..., None]
    sample = torch.randperm(17 * 13, generator=torch.Generator().manual_seed(1)) if geo_pixels else torch.arange(221)
    counts = []
    fixed = {}

    def loss(m, s):
        _, a = render_geometry(primitive, m, quats, s, opac, cols, K, V1)
        _, b = render_geometry(primitive, m, quats, s, opac, cols, K, V2)
        geo, photo, c = multiview_losses(
            a,
            b,
            grey1,
            grey2,
            sample,
            patch_size=3,
            pixel_noise=2.0,
            min_patch_std=0.0,
            weights=fixed.get("w"),
            geo_pixels=geo_pixels,
        )
        fixed.setdefault("w", c["weights"])
        counts.append((c["geo_pixels"], c["ncc_patches"]))
        return geo + photo

    m, s = means.clone().requires_grad_(True), scales.clone().requires_grad_(True)
    value = loss(m, s)
    value.backward()
    assert counts[0][0] > (50 if geo_pixels else 100) and counts[0][1] > 20  # both terms take part
    assert float(m.grad.abs().sum()) > 0
    assert torch.autograd.gradcheck(loss, (m, s), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert len(set(counts)) == 1


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_a_pixel_subset_of_the_geometric_term_is_the_same_maths(primitive):
    """``geo_pixels`` as large as the image: the same losses and weights as
    every pixel (float64; sums in another order, so to 1e-12); smaller: the
    mean over exactly the first covered pixels of ``order``, and the
    photometric term draws its patches among them."""
    means, quats, scales, opac, cols, K, V1, V2 = small_pair(primitive)
    with torch.no_grad():
        o1, a = render_geometry(primitive, means, quats, scales, opac, cols, K, V1)
        o2, b = render_geometry(primitive, means * 1.02, quats, scales, opac, cols, K, V2)
    grey1, grey2 = grey(o1.rgb), grey(o2.rgb)
    order = torch.randperm(221, generator=torch.Generator().manual_seed(3))
    kw = dict(patch_size=3, pixel_noise=2.0, min_patch_std=0.0)
    full = multiview_losses(a, b, grey1, grey2, order, **kw)
    every = multiview_losses(a, b, grey1, grey2, order, geo_pixels=221, **kw)
    for x, y in zip(full[:2], every[:2]):
        assert torch.allclose(x, y, rtol=1e-12, atol=0)
    assert torch.equal(full[2]["weights"], every[2]["weights"])
    some = multiview_losses(a, b, grey1, grey2, order, geo_pixels=60, **kw)
    covered = ((a.alpha > 0.5) & (a.depth > 0)).reshape(-1)
    first = order[covered[order]][:60]
    w = full[2]["weights"]
    assert torch.equal(some[2]["weights"][first], w[first])  # the same w there, zero elsewhere
    assert int((some[2]["weights"] > 0).sum()) == int((w[first] > 0).sum()) == some[2]["geo_pixels"]
    assert 0 < some[2]["ncc_patches"] < full[2]["ncc_patches"]


def texture(p: torch.Tensor) -> torch.Tensor:
    """A smooth colour [P, 3] at world points p [P, 3] of the plane z = 0."""
    return 0.5 + 0.4 * torch.sin(4.0 * p[:, :1] + torch.tensor([0.0, 1.0, 2.0], dtype=D)) * torch.cos(3.0 * p[:, 1:2])


def plane_of_surfels(s: float):
    """A plane z = 0 of 30 x 30 surfels coloured by :func:`texture`, its
    positions and sizes scaled by ``s`` about camera 1's centre (0, 0, -3):
    camera 1 renders the same image for any s, at depth s x the truth."""
    k = torch.linspace(-1.2, 1.2, 30, dtype=D)
    y, x = torch.meshgrid(k, k, indexing="ij")
    pts = torch.stack([x.reshape(-1), y.reshape(-1), torch.zeros(900, dtype=D)], -1)
    centre = torch.tensor([0.0, 0.0, -3.0], dtype=D)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=D).expand(900, 4)
    scales = torch.full((900, 2), 0.06, dtype=D)
    return centre + s * (pts - centre), quats, s * scales, torch.full((900,), 0.9, dtype=D), texture(pts)


def photo_of_plane(K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """The photo [48, 48, 3] of the textured plane z = 0: the texture where each
    pixel's ray meets it (a photo of the real surface, not of surfels)."""
    R, t = V[:3, :3], V[:3, 3]
    rays = pixel_rays(K, 48, 48)
    dirs, eye = rays @ R, -R.T @ t  # world directions (R^T ray) and the centre
    return texture(eye - (eye[2] / dirs[:, 2:3]) * dirs).reshape(48, 48, 3)


def test_the_photometric_consistency_moves_a_surface_the_reference_photo_cannot_place():
    """Camera 1's render is the same at every depth scale s (the surface slides
    along its rays), so its photometric loss cannot place the surface; the
    multi-view terms against camera 2's photo bring s from 1.15 back to 1."""
    K = intrinsics(48, 48, 55.0)
    V1 = look_at_viewmat((0.0, 0.0, -3.0), (0.0, 0.0, 0.0))
    V2 = look_at_viewmat((0.8, 0.0, -3.0), (0.0, 0.0, 0.0))
    w = torch.tensor([0.299, 0.587, 0.114], dtype=D)
    photos = [photo_of_plane(K, V) for V in (V1, V2)]
    greys = [(p @ w)[..., None] for p in photos]
    log_s = torch.tensor(math.log(1.15), dtype=D, requires_grad=True)  # 15 % too far: ~1.6 px off in camera 2

    def render(V):
        return rasterize(*plane_of_surfels(torch.exp(log_s)), V, K, 48, 48)

    with torch.no_grad():
        truth = rasterize(*plane_of_surfels(1.0), V1, K, 48, 48).rgb
    out1 = render(V1)
    (out1.rgb - photos[0]).abs().mean().backward()  # camera 1's photometric loss is blind to the depth
    assert abs(float(log_s.grad.detach())) < 1e-9 and float((out1.rgb.detach() - truth).abs().max()) < 1e-9
    opt = torch.optim.Adam([log_s], lr=0.01)
    for _ in range(40):
        opt.zero_grad()
        a, b = render(V1), render(V2)
        ga = ViewGeometry(a.depth, a.normal, a.alpha, K, V1)
        gb = ViewGeometry(b.depth, b.normal, b.alpha, K, V2)
        geo, photo, c = multiview_losses(ga, gb, greys[0], greys[1], torch.arange(48 * 48), pixel_noise=1.0)
        (0.03 * geo + 0.15 * photo).backward()
        opt.step()
    assert c["ncc_patches"] > 500
    s = float(torch.exp(log_s.detach()))
    assert abs(s - 1.0) < 0.02, s


def test_a_neighbour_facing_away_gives_zero_losses_and_finite_gradients():
    """Every surface point is behind the neighbour: nothing is valid, and the
    graph holds no inf or NaN (0 x inf in a masked-out entry would poison
    the gradient)."""
    K1, V1, _, _ = two_cameras()
    V2 = look_at_viewmat((0.3, -0.2, -4.0), (0.3, -0.2, -8.0))  # at camera 1's centre, looking away
    depth, normal = analytic_plane(*PLANE, K1, V1)
    depth = depth.clone().requires_grad_(True)
    ref = ViewGeometry(depth, normal, torch.ones(48, 64, dtype=D), K1, V1)
    nb = ViewGeometry(depth.detach(), normal, torch.ones(48, 64, dtype=D), K1, V2)
    grey_img = torch.rand(48, 64, 1, dtype=D, generator=torch.Generator().manual_seed(1))
    geo, photo, c = multiview_losses(ref, nb, grey_img, grey_img, torch.arange(48 * 64), min_patch_std=0.0)
    (geo + photo).backward()
    assert c["geo_pixels"] == 0 and float(geo.detach()) == 0 and float(photo.detach()) == 0
    assert torch.isfinite(depth.grad).all()


def test_points_on_or_behind_the_camera_project_off_the_image_with_finite_gradients():
    """A point behind the neighbour (z < 0) would otherwise project to its
    mirror image, possibly inside the image; one at z = 0 to inf."""
    K = intrinsics(64, 48, 55.0)
    X = torch.tensor([[0.1, 0.2, 0.0], [0.1, -0.1, -2.0], [0.1, 0.2, 2.0]], dtype=D, requires_grad=True)
    uv = project(X, K)
    assert (uv[:2] == -1.0e6).all() and torch.allclose(uv[2], K[:2, :2] @ X[2, :2].detach() / 2 + K[:2, 2])
    uv.sum().backward()
    assert torch.isfinite(X.grad).all() and (X.grad[:2] == 0).all()
    flip = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=D))[None]  # z -> -z: every point lands behind
    q = apply_homography(flip, torch.tensor([[[3.0, 4.0]]], dtype=D))
    assert (q == -1.0e6).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_losses_on_cuda_match_the_cpu():
    """The terms are PyTorch ops: the same figures on a GPU (float64: to 1e-9)."""
    means, quats, scales, opac, cols, K, V1, V2 = small_pair("2dgs")
    with torch.no_grad():
        a, ga = render_geometry("2dgs", means, quats, scales, opac, cols, K, V1)
        b, gb = render_geometry("2dgs", means, quats, scales, opac, cols, K, V2)
    grey1, grey2 = a.rgb.mean(-1, keepdim=True), b.rgb.mean(-1, keepdim=True)
    results = []
    for dev in ("cpu", "cuda"):
        depth = ga.depth.detach().to(dev).requires_grad_(True)  # a leaf on each device, ga.depth untouched
        ref = ViewGeometry(depth, ga.normal.to(dev), ga.alpha.to(dev), K.to(dev), V1.to(dev))
        nb = ViewGeometry(gb.depth.to(dev), gb.normal.to(dev), gb.alpha.to(dev), K.to(dev), V2.to(dev))
        order = torch.arange(17 * 13, device=dev)
        geo, photo, _ = multiview_losses(ref, nb, grey1.to(dev), grey2.to(dev), order, patch_size=3, pixel_noise=2.0)
        (geo + photo).backward()
        results.append((geo.item(), photo.item(), depth.grad.cpu()))
    assert abs(results[0][0] - results[1][0]) < 1e-9 and abs(results[0][1] - results[1][1]) < 1e-9
    assert torch.allclose(results[0][2], results[1][2], atol=1e-9)
