"""Loss terms: SSIM, photometric loss, depth -> normal, geometric terms."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from splat.losses import (
    _fused_ssim_applies,
    depth_jump_weight,
    depth_normal_consistency_loss,
    depth_to_normal,
    depth_to_points,
    image_edge_weight,
    l1_loss,
    normal_consistency_loss,
    photometric_loss,
    psnr,
    ssim,
    ssim_torch,
    total_loss,
)


def test_ssim_identical_is_one_and_bounded():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(24, 20, 3, generator=g)
    assert abs(float(ssim(a, a)) - 1.0) < 1e-6
    b = (a + 0.2 * torch.randn(24, 20, 3, generator=g)).clamp(0, 1)
    s = float(ssim(a, b))
    assert -1.0 <= s < 0.95
    assert abs(s - float(ssim(b, a))) < 1e-6  # symmetric
    # more noise, lower SSIM
    c = (a + 0.4 * torch.randn(24, 20, 3, generator=g)).clamp(0, 1)
    assert float(ssim(a, c)) < s


def test_ssim_matches_reference_formula_on_constant_images():
    # Constant images x, y: variances are 0 and SSIM reduces to the luminance
    # term (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1), away from the zero-padded border.
    x = torch.full((32, 32, 1), 0.3, dtype=torch.float64)  # float64: var = E[x^2] - mu^2 cancels
    y = torch.full((32, 32, 1), 0.6, dtype=torch.float64)
    C1 = 0.01**2
    expected = (2 * 0.3 * 0.6 + C1) / (0.09 + 0.36 + C1)
    m = ssim(x, y, reduce=False)[0, 0, 10:-10, 10:-10]
    assert torch.allclose(m, torch.full_like(m, expected), atol=1e-5)


def test_photometric_loss_properties():
    a = torch.rand(16, 16, 3)
    assert float(photometric_loss(a, a)) < 1e-6
    b = torch.rand(16, 16, 3)
    assert float(photometric_loss(a, b)) > 0
    assert abs(float(photometric_loss(a, b, ssim_lambda=0.0)) - float(l1_loss(a, b))) < 1e-7
    # gradient flows and points downhill
    p = b.clone().requires_grad_(True)
    photometric_loss(p, a).backward()
    q = (p - 0.1 * p.grad).detach()
    assert float(photometric_loss(q, a)) < float(photometric_loss(b, a))


def test_psnr():
    a = torch.zeros(8, 8, 3)
    assert abs(psnr(a + 0.1, a) - 20.0) < 1e-4
    assert math.isinf(psnr(a, a))


def _plane_depth(H, W, K, n_cam, d):
    """Depth map of the plane n . X = d (camera space) seen through pixel centres."""
    j = torch.arange(W, dtype=torch.float64) + 0.5
    i = torch.arange(H, dtype=torch.float64) + 0.5
    x = ((j[None, :] - K[0, 2]) / K[0, 0]).expand(H, W)
    y = ((i[:, None] - K[1, 2]) / K[1, 1]).expand(H, W)
    ray = torch.stack([x, y, torch.ones_like(x)], -1)
    return d / (ray @ n_cam)


def test_depth_to_normal_plane_world_space_facing_camera():
    H, W = 20, 24
    K = torch.tensor([[30.0, 0, 12.0], [0, 30.0, 10.0], [0, 0, 1]], dtype=torch.float64)
    n_cam = torch.tensor([0.3, -0.2, -1.0], dtype=torch.float64)
    n_cam = n_cam / n_cam.norm()  # faces the camera (n . z < 0)
    depth = _plane_depth(H, W, K, n_cam, d=-4.0)  # plane n.X = -4 lies in front (z > 0)
    assert (depth > 0).all()
    # rotate the camera: viewmat = [R | t]; the world normal is R^T n_cam
    ang = 0.7
    R = torch.tensor(
        [[math.cos(ang), 0, math.sin(ang)], [0, 1, 0], [-math.sin(ang), 0, math.cos(ang)]], dtype=torch.float64
    )
    viewmat = torch.eye(4, dtype=torch.float64)
    viewmat[:3, :3] = R
    viewmat[:3, 3] = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    n = depth_to_normal(depth, K, viewmat)
    inner = n[1:-1, 1:-1]
    expected = R.T @ n_cam
    assert torch.allclose(inner, expected.expand_as(inner), atol=1e-6)
    assert (n[0] == 0).all() and (n[:, -1] == 0).all()  # no central difference on the border
    pts = depth_to_points(depth, K)
    assert torch.allclose(pts[..., 2], depth)


def test_normal_consistency_loss():
    n = torch.nn.functional.normalize(torch.randn(8, 8, 3), dim=-1)
    alpha = torch.rand(8, 8)
    assert float(normal_consistency_loss(n, n, torch.ones(8, 8))) < 1e-6
    assert float(normal_consistency_loss(n, -n, torch.ones(8, 8))) > 1.99
    assert float(normal_consistency_loss(n, -n, torch.zeros(8, 8))) == 0.0  # empty pixels cost nothing
    r = n.clone().requires_grad_(True)
    a = alpha.clone().requires_grad_(True)
    normal_consistency_loss(r, -n, a).backward()
    assert r.grad is not None and a.grad is None  # alpha is detached


def test_ssim_separable_equals_2d_window():
    """The separable implementation equals the textbook 11x11-window SSIM."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    a = torch.rand(1, 3, 20, 17, generator=g, dtype=torch.float64)
    b = torch.rand(1, 3, 20, 17, generator=g, dtype=torch.float64)
    x = torch.arange(11, dtype=torch.float64) - 5
    w1 = torch.exp(-(x**2) / (2 * 1.5**2))
    w1 = w1 / w1.sum()
    w = (w1[:, None] * w1[None]).expand(3, 1, 11, 11)

    def filt(t):
        return F.conv2d(t, w, padding=5, groups=3)

    mu1, mu2 = filt(a), filt(b)
    s1, s2, s12 = filt(a * a) - mu1**2, filt(b * b) - mu2**2, filt(a * b) - mu1 * mu2
    C1, C2 = 0.01**2, 0.03**2
    ref = ((2 * mu1 * mu2 + C1) * (2 * s12 + C2)) / ((mu1**2 + mu2**2 + C1) * (s1 + s2 + C2))
    assert torch.allclose(ssim(a, b, reduce=False), ref, atol=1e-12)


# ---- the fused CPU SSIM (splat/kernels/cpu/ssim_cpu.h) against ssim_torch --------
def _ssim_pair(h, w, c, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(h, w, c, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    b = torch.rand(h, w, c, generator=g, dtype=torch.float64).to(dtype)
    return a, b


def _value_and_grad(fn, a, b):
    a.grad = None
    value = fn(a, b)
    value.backward()
    return value.detach(), a.grad.clone()


@pytest.mark.parametrize("h, w, c", [(37, 53, 3), (4, 3, 1), (16, 9, 2)])
def test_fused_ssim_matches_torch_ssim_float64(h, w, c):
    """Value and gradient equal the plain-PyTorch SSIM to float64 rounding
    (1e-12 relative: both sum ~121 products per statistic in different orders).
    Images smaller than the 11-pixel window exercise the zero padding."""
    a, b = _ssim_pair(h, w, c, torch.float64)
    assert _fused_ssim_applies(a, b, True)
    v_fused, g_fused = _value_and_grad(ssim, a, b)
    v_torch, g_torch = _value_and_grad(ssim_torch, a, b)
    assert abs(float(v_fused - v_torch)) <= 1e-12
    assert float((g_fused - g_torch).abs().max()) <= 1e-12 * float(g_torch.abs().max())


def test_fused_ssim_matches_torch_ssim_float32():
    """float32: value within 1e-6 and gradient within 1e-5 of its largest
    entry (measured 7e-7: float32 rounding of the filtered statistics, eps
    6e-8, amplified by the variance terms' cancellation e_xx - mu_x^2)."""
    a, b = _ssim_pair(48, 40, 3, torch.float32, seed=3)
    v_fused, g_fused = _value_and_grad(ssim, a, b)
    v_torch, g_torch = _value_and_grad(ssim_torch, a, b)
    assert abs(float(v_fused - v_torch)) <= 1e-6
    assert float((g_fused - g_torch).abs().max()) <= 1e-5 * float(g_torch.abs().max())


def test_fused_ssim_finite_differences():
    a, b = _ssim_pair(9, 12, 2, torch.float64, seed=5)
    assert torch.autograd.gradcheck(lambda x: ssim(x, b), (a,), eps=1e-6, atol=1e-9, rtol=1e-6)


def test_fused_ssim_same_bits_for_any_thread_count():
    a, b = _ssim_pair(70, 45, 3, torch.float32, seed=9)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(_value_and_grad(ssim, a, b))
    finally:
        torch.set_num_threads(threads)
    for v, g in results[1:]:
        assert torch.equal(v, results[0][0]) and torch.equal(g, results[0][1])


def test_ssim_falls_back_to_torch_where_the_fused_op_does_not_apply():
    a, b = _ssim_pair(20, 21, 3, torch.float64)
    assert not _fused_ssim_applies(a, b.requires_grad_(True), True)  # gradient for both images
    assert not _fused_ssim_applies(a, b.detach(), False)  # per-pixel map
    b = b.detach().requires_grad_(True)
    v, _ = _value_and_grad(ssim, a, b)
    with torch.no_grad():
        assert b.grad is not None and float(v - ssim_torch(a, b)) == 0.0


# ---- the fused CPU depth-normal consistency loss (cpu/normal_loss_cpu.h) -------------------
def _normal_loss_case(h, w, dtype, seed=0, hole=0.0):
    """Depth with an invalid pixel (z = hole) and an invalid row (z = -1),
    random normals and alpha, an off-centre camera with a rotation."""
    from splat.geometry import quat_to_rotmat

    g = torch.Generator().manual_seed(seed)
    depth = 2.0 + torch.rand(h, w, generator=g, dtype=torch.float64)
    if h > 5 and w > 4:
        depth[3, 4] = hole
        depth[5, :] = -1.0
    normal = torch.randn(h, w, 3, generator=g, dtype=torch.float64)
    alpha = torch.rand(h, w, generator=g, dtype=torch.float64)
    K = torch.tensor([[30.0, 0.0, 0.45 * w], [0.0, 28.0, 0.55 * h], [0.0, 0.0, 1.0]], dtype=torch.float64)
    viewmat = torch.eye(4, dtype=torch.float64)
    viewmat[:3, :3] = quat_to_rotmat(torch.tensor([[0.9, 0.1, -0.2, 0.3]], dtype=torch.float64))[0]
    viewmat[:3, 3] = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    t = [x.to(dtype) for x in (depth, normal, alpha, K, viewmat)]
    return [t[0].requires_grad_(True), t[1].requires_grad_(True)] + t[2:]


def _unfused_normal_loss(depth, normal, alpha, K, viewmat):
    return normal_consistency_loss(normal, depth_to_normal(depth, K, viewmat), alpha)


def _loss_and_grads(fn, case):
    depth, normal = case[0], case[1]
    depth.grad = normal.grad = None
    loss = fn(*case)
    loss.backward()
    # depth_to_normal of an all-border image never uses depth: no gradient at all
    v_depth = torch.zeros_like(depth) if depth.grad is None else depth.grad.clone()
    return loss.detach(), v_depth, normal.grad.clone()


@pytest.mark.parametrize("h, w", [(23, 31), (2, 7), (3, 3)])
def test_fused_normal_loss_matches_torch_float64(h, w):
    """Loss and both gradients equal depth_to_normal + normal_consistency_loss
    to float64 rounding (1e-12 relative); 2 x 7 and 3 x 3 are all border."""
    case = _normal_loss_case(h, w, torch.float64)
    fused = _loss_and_grads(depth_normal_consistency_loss, case)
    plain = _loss_and_grads(_unfused_normal_loss, case)
    assert abs(float(fused[0] - plain[0])) <= 1e-12
    for a, b in zip(fused[1:], plain[1:]):
        assert float((a - b).abs().max()) <= 1e-12 * max(float(b.abs().max()), 1e-30)


def test_fused_normal_loss_matches_torch_float32():
    """float32: loss within 1e-6, gradients within 1e-5 of their largest entry
    (measured ~2e-7: rounding of the unprojection, cross product and norm)."""
    case = _normal_loss_case(40, 50, torch.float32, seed=2)
    fused = _loss_and_grads(depth_normal_consistency_loss, case)
    plain = _loss_and_grads(_unfused_normal_loss, case)
    assert abs(float(fused[0] - plain[0])) <= 1e-6
    for a, b in zip(fused[1:], plain[1:]):
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())


def test_fused_normal_loss_finite_differences():
    # the hole at -0.5, not 0: a step of eps across z = 0 switches the pixel on
    depth, normal, alpha, K, viewmat = _normal_loss_case(9, 11, torch.float64, seed=4, hole=-0.5)
    assert torch.autograd.gradcheck(
        lambda d, n: depth_normal_consistency_loss(d, n, alpha, K, viewmat),
        (depth, normal),
        eps=1e-6,
        atol=1e-9,
        rtol=1e-6,
    )


def test_fused_normal_loss_same_bits_for_any_thread_count():
    case = _normal_loss_case(61, 47, torch.float32, seed=6)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(_loss_and_grads(depth_normal_consistency_loss, case))
    finally:
        torch.set_num_threads(threads)
    for r in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, results[0]))


def test_normal_loss_with_camera_gradients_takes_the_torch_path():
    """The fused op gives no gradient to K or viewmat, so it steps aside when they need one."""
    depth, normal, alpha, K, viewmat = _normal_loss_case(12, 13, torch.float64)
    viewmat.requires_grad_(True)
    depth_normal_consistency_loss(depth, normal, alpha, K, viewmat).backward()
    assert viewmat.grad is not None and float(viewmat.grad.abs().sum()) > 0


def test_image_edge_weight_fades_edges_and_borders():
    """(1 - g)^2 with g min-max normalised: 0 on the border and on the
    strongest edge, 1 where the photo is flat; a flat photo weighs 1 inside."""
    img = torch.zeros(8, 10, 3, dtype=torch.float64)
    img[:, 5:] = 1.0  # a vertical step between columns 4 and 5
    w = image_edge_weight(img)
    assert w.shape == (8, 10)
    assert torch.equal(w[0], torch.zeros(10)) and torch.equal(w[:, -1], torch.zeros(8))  # border
    assert torch.equal(w[1:-1, 4], torch.zeros(6)) and torch.equal(w[1:-1, 5], torch.zeros(6))  # the edge
    assert torch.equal(w[1:-1, 1:4], torch.ones(6, 3)) and torch.equal(w[1:-1, 6:9], torch.ones(6, 3))
    # A weaker edge (half the step) in the same photo: g = 1/2, weight 1/4.
    img[:, :2] = 0.5
    w = image_edge_weight(img)
    assert torch.allclose(w[1:-1, 1], torch.full((6,), 0.25, dtype=torch.float64))
    assert torch.equal(image_edge_weight(torch.full((5, 5, 3), 0.3))[1:-1, 1:-1], torch.ones(3, 3))
    assert torch.equal(image_edge_weight(torch.ones(2, 9, 3)), torch.zeros(2, 9))  # no interior


def test_normal_edge_weight_multiplies_the_normal_terms_alpha():
    """loss.normal_edge_weight: the normal term is normal_consistency_loss
    with alpha x image_edge_weight(gt), and still reaches depth and normals."""
    from splat.outputs import RasterOutput

    g = torch.Generator().manual_seed(3)
    H, W = 12, 14
    depth = (2.0 + 0.1 * torch.rand(H, W, generator=g, dtype=torch.float64)).requires_grad_(True)
    normal = torch.nn.functional.normalize(torch.randn(H, W, 3, generator=g, dtype=torch.float64), dim=-1)
    normal.requires_grad_(True)
    alpha = torch.rand(H, W, generator=g, dtype=torch.float64)
    gt = torch.rand(H, W, 3, generator=g, dtype=torch.float64)
    K = torch.tensor([[20.0, 0, 7], [0, 20.0, 6], [0, 0, 1]], dtype=torch.float64)
    viewmat = torch.eye(4, dtype=torch.float64)
    out = RasterOutput(
        rgb=gt.clone(), alpha=alpha, depth=depth, median_depth=depth, normal=normal,
        distortion=torch.zeros(H, W, dtype=torch.float64), radii=None, means2d=None,
    )  # fmt: skip
    cfg = dict(ssim_lambda=0.0, dist_lambda=0.0, normal_lambda=1.0, normal_from=0)
    _, plain = total_loss(out, gt, K, viewmat, 0, cfg)
    loss, weighted = total_loss(out, gt, K, viewmat, 0, dict(cfg, normal_edge_weight=True))
    with torch.no_grad():
        expected = normal_consistency_loss(normal, depth_to_normal(depth, K, viewmat), alpha * image_edge_weight(gt))
    assert weighted["normal"] == pytest.approx(float(expected), rel=1e-12)
    assert weighted["normal"] < plain["normal"]  # every weight is at most 1, the border's 0
    loss.backward()
    assert depth.grad.abs().sum() > 0 and normal.grad.abs().sum() > 0


def test_depth_jump_weight_keeps_tilted_planes_and_drops_jumps():
    """1 everywhere inside on a steeply tilted plane (its inverse depth is
    affine in the pixels); 0 on the two columns that straddle a jump to a
    second plane, on the border and next to uncovered pixels."""
    H, W = 10, 16
    K = torch.tensor([[30.0, 0, 8], [0, 30.0, 5], [0, 0, 1]], dtype=torch.float64)
    tilted = _plane_depth(H, W, K, torch.tensor([0.8, 0.1, 0.3], dtype=torch.float64), 0.9)  # ~70 deg
    assert float(tilted.min()) > 0 and float(tilted.max() / tilted.min()) > 2  # a real slope
    w = depth_jump_weight(tilted, 1e-9)
    assert torch.equal(w[1:-1, 1:-1], torch.ones(H - 2, W - 2, dtype=torch.float64))
    assert torch.equal(w[0], torch.zeros(W, dtype=torch.float64)) and torch.equal(
        w[:, -1], torch.zeros(H, dtype=torch.float64)
    )
    # A second plane 5 % farther from column 8 on: a jump between columns 7 and 8.
    front = _plane_depth(H, W, K, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), 2.0)
    step = torch.where(torch.arange(W) < 8, front, 1.05 * front)
    w = depth_jump_weight(step, 0.01)
    assert torch.equal(w[1:-1, 7], torch.zeros(H - 2, dtype=torch.float64))
    assert torch.equal(w[1:-1, 8], torch.zeros(H - 2, dtype=torch.float64))
    assert torch.equal(w[1:-1, 1:7], torch.ones(H - 2, 6, dtype=torch.float64))
    assert torch.equal(w[1:-1, 9:-1], torch.ones(H - 2, W - 10, dtype=torch.float64))
    assert torch.equal(depth_jump_weight(step, 0.1)[1:-1, 1:-1], torch.ones(H - 2, W - 2, dtype=torch.float64))
    # An uncovered pixel: it and its four neighbours get 0.
    holed = front.clone()
    holed[4, 5] = 0.0
    w = depth_jump_weight(holed, 0.01)
    for y, x in ((4, 5), (3, 5), (5, 5), (4, 4), (4, 6)):
        assert w[y, x] == 0
    assert w[4, 3] == 1 and w[2, 5] == 1
    assert torch.equal(depth_jump_weight(torch.ones(2, 9), 0.01), torch.zeros(2, 9))  # no interior


def _normal_term_case(seed=5):
    from splat.outputs import RasterOutput

    g = torch.Generator().manual_seed(seed)
    H, W = 12, 14
    K = torch.tensor([[20.0, 0, 7], [0, 20.0, 6], [0, 0, 1]], dtype=torch.float64)
    base = _plane_depth(H, W, K, torch.tensor([0.2, -0.1, 1.0], dtype=torch.float64), 2.0)
    base = torch.where(torch.arange(W) < 7, base, 1.3 * base)  # a jump between columns 6 and 7
    depth = (base * (1 + 1e-4 * torch.rand(H, W, generator=g, dtype=torch.float64))).requires_grad_(True)
    normal = torch.nn.functional.normalize(torch.randn(H, W, 3, generator=g, dtype=torch.float64), dim=-1)
    normal.requires_grad_(True)
    alpha = torch.rand(H, W, generator=g, dtype=torch.float64)
    gt = torch.rand(H, W, 3, generator=g, dtype=torch.float64)
    out = RasterOutput(
        rgb=gt.clone(), alpha=alpha, depth=depth, median_depth=depth, normal=normal,
        distortion=torch.zeros(H, W, dtype=torch.float64), radii=None, means2d=None,
    )  # fmt: skip
    return out, gt, K, torch.eye(4, dtype=torch.float64)


def test_normal_max_bend_leaves_depth_jumps_out_of_the_normal_term():
    """loss.normal_max_bend: the normal term with alpha x depth_jump_weight;
    its gradients match float64 finite differences (the weight is a
    constant there: the noise bends u by ~1e-4, the jump by ~0.3)."""
    out, gt, K, viewmat = _normal_term_case()
    cfg = dict(ssim_lambda=0.0, dist_lambda=0.0, normal_lambda=1.0, normal_from=0, normal_max_bend=0.02)
    _, terms = total_loss(out, gt, K, viewmat, 0, cfg)
    mask = depth_jump_weight(out.depth, 0.02)
    assert float(mask[1:-1, 1:-1].sum()) == (12 - 2) * (14 - 2 - 2)  # only the two jump columns go
    with torch.no_grad():
        expected = normal_consistency_loss(out.normal, depth_to_normal(out.depth, K, viewmat), out.alpha * mask)
    assert terms["normal"] == pytest.approx(float(expected), rel=1e-12)

    def normal_term(depth, normal):
        o = dataclasses.replace(out, depth=depth, median_depth=depth, normal=normal)
        return total_loss(o, gt, K, viewmat, 0, cfg)[0]  # the photometric part is a constant here

    assert torch.autograd.gradcheck(normal_term, (out.depth, out.normal), eps=1e-7, atol=1e-8)


def test_normal_depth_gradient_false_turns_surfels_only():
    """loss.normal_depth_gradient=false: the same value and normal gradient,
    and no gradient to the depth from the normal term."""
    out, gt, K, viewmat = _normal_term_case()
    cfg = dict(ssim_lambda=0.0, dist_lambda=0.0, normal_lambda=1.0, normal_from=0)
    loss, terms = total_loss(out, gt, K, viewmat, 0, cfg)
    loss.backward()
    attached = out.normal.grad.clone()
    assert float(out.depth.grad.abs().sum()) > 0
    out.depth.grad, out.normal.grad = None, None
    loss, detached = total_loss(out, gt, K, viewmat, 0, dict(cfg, normal_depth_gradient=False))
    loss.backward()
    assert detached["normal"] == terms["normal"]
    assert out.depth.grad is None or float(out.depth.grad.abs().sum()) == 0
    assert torch.equal(out.normal.grad, attached)
