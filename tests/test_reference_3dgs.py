"""The 3D Gaussian reference (splat/reference_3dgs.py, issue 22) against its
own definitions and, where the definitions coincide, gsplat's pure-PyTorch
3DGS projection (an independent implementation, installed with the test
extra).

Everything is float64.  Tolerances: 1e-10 where the same formula is
evaluated in another order (rounding only); the brute-force checks state
their own."""

from __future__ import annotations

import math

import pytest
import torch

from splat import conventions as cv
from splat.geometry import quat_to_rotmat
from splat.reference_3dgs import project_gaussians, rasterize_reference_3dgs, sample_depth_and_normal

W, H = 20, 16
NEAR, FAR = 0.2, 100.0


def _scene(n=6, seed=0, flat=False):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * torch.tensor(
        [1.2, 1.0, 0.8], dtype=torch.float64
    )
    quats = torch.randn(n, 4, generator=g, dtype=torch.float64)
    scales = 0.05 + 0.2 * torch.rand(n, 3, generator=g, dtype=torch.float64)
    if flat:
        scales[:, 2] = 1e-5
    opacities = 0.3 + 0.6 * torch.rand(n, generator=g, dtype=torch.float64)
    colors = torch.rand(n, 3, generator=g, dtype=torch.float64)
    angle = 0.3
    viewmat = torch.eye(4, dtype=torch.float64)
    viewmat[:3, :3] = torch.tensor(
        [[math.cos(angle), 0, -math.sin(angle)], [0, 1, 0], [math.sin(angle), 0, math.cos(angle)]], dtype=torch.float64
    )
    viewmat[:3, 3] = torch.tensor([0.1, -0.05, 3.0], dtype=torch.float64)
    K = torch.tensor([[24.0, 0, 9.5], [0, 23.0, 8.5], [0, 0, 1]], dtype=torch.float64)  # off-centre
    return means, quats, scales, opacities, colors, viewmat, K


@pytest.mark.parametrize("antialiased", [False, True])
def test_projection_matches_gsplat(antialiased):
    """Centres, conics (S^-1) and the antialiasing compensation against
    gsplat's ``_fully_fused_projection``, Gaussians inside and outside the
    clamped frustum included."""
    torch_impl = pytest.importorskip("gsplat.cuda._torch_impl")
    means, quats, scales, _, _, viewmat, K = _scene(12)
    means[0] = torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64)  # far outside the image: the clamp acts
    _, precision, centre, conic, factor = project_gaussians(means, quats, scales, viewmat, K, W, H, antialiased)
    covars, _ = torch_impl._quat_scale_to_covar_preci(
        quats / quats.norm(dim=-1, keepdim=True), scales, compute_preci=False
    )
    radii, means2d, depths, conics, comp = torch_impl._fully_fused_projection(
        means, covars, viewmat[None], K[None], W, H, eps2d=cv.EWA_DILATION, calc_compensations=antialiased
    )
    assert torch.allclose(centre, means2d[0], rtol=1e-10, atol=1e-10)
    ours = torch.stack([conic[:, 0, 0], conic[:, 0, 1], conic[:, 1, 1]], -1)
    assert torch.allclose(ours, conics[0], rtol=1e-10, atol=1e-12)
    assert torch.allclose(conic[:, 0, 1], conic[:, 1, 0])
    if antialiased:
        assert torch.allclose(factor, comp[0], rtol=1e-10, atol=1e-12) and (factor < 1).all()
    else:
        assert torch.equal(factor, torch.ones_like(factor))
    # the precision is the inverse of the camera-space covariance times
    # min(s)^2 (largest eigenvalue 1; depth and normal do not see the factor)
    W3 = viewmat[:3, :3]
    factor_min = scales.amin(-1)[:, None, None] ** 2
    assert torch.allclose(precision @ (W3 @ covars @ W3.T), factor_min * torch.eye(3, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(torch.linalg.eigvalsh(precision)[:, -1], torch.ones(12, dtype=torch.float64))


def test_depth_is_where_the_density_peaks_along_the_ray():
    """t* zeroes the derivative of the Mahalanobis distance along the ray
    (to rounding), and a brute-force search over 20,001 depths finds the
    same maximum of the density (to its grid step, 5e-4)."""
    means, quats, scales, _, _, viewmat, K = _scene(8, seed=1)
    mu, precision, *_ = project_gaussians(means, quats, scales, viewmat, K, W, H)
    g = torch.Generator().manual_seed(2)
    pix = torch.rand(30, 2, generator=g, dtype=torch.float64) * torch.tensor([W, H], dtype=torch.float64)
    rays = torch.cat([pix, torch.ones(30, 1, dtype=torch.float64)], 1) @ torch.linalg.inv(K).T  # [P, 3]
    rays = rays[:, None, :].expand(30, 8, 3)
    z, normal = sample_depth_and_normal(rays, mu, precision)
    x = z[..., None] * rays
    slope = torch.einsum("pni,nij,pnj->pn", rays, precision, x - mu[None])
    assert slope.abs().max() < 1e-9
    ts = torch.linspace(0.0, 10.0, 20001, dtype=torch.float64)
    for p in range(0, 30, 7):
        for n in range(8):
            r = ts[:, None] * rays[p, n][None] - mu[n][None]  # [T, 3]
            maha = torch.einsum("ti,ij,tj->t", r, precision[n], r)
            assert abs(float(ts[maha.argmin()]) - float(z[p, n])) <= 5e-4 + 1e-12


def test_normal_is_the_normal_of_the_peak_surface():
    """The peaks of neighbouring rays span the tangent plane of the surface a
    Gaussian renders as depth: the normal is orthogonal to both finite
    central differences (to their h^2 error), faces the camera and is a
    unit vector.  A normal taken at the centre instead (P_c mu_c, RaDe-GS's
    per-Gaussian one) is off by ~1e-2 at these pixels."""
    means, quats, scales, _, _, viewmat, K = _scene(6, seed=3)
    mu, precision, *_ = project_gaussians(means, quats, scales, viewmat, K, W, H)
    K_inv = torch.linalg.inv(K)
    h = 1e-4
    pix = torch.tensor([[5.3, 7.1], [12.2, 3.4], [9.9, 9.9]], dtype=torch.float64)

    def peaks(p):
        rays = (torch.cat([p, torch.ones(len(p), 1, dtype=torch.float64)], 1) @ K_inv.T)[:, None, :].expand(-1, 6, 3)
        z, n = sample_depth_and_normal(rays, mu, precision)
        return z[..., None] * rays, n

    x0, n0 = peaks(pix)
    du, dv = torch.tensor([h, 0.0], dtype=torch.float64), torch.tensor([0.0, h], dtype=torch.float64)
    tu = (peaks(pix + du)[0] - peaks(pix - du)[0]) / (2 * h)  # central: error ~h^2 = 1e-8
    tv = (peaks(pix + dv)[0] - peaks(pix - dv)[0]) / (2 * h)
    for t in (tu, tv):
        cos = (t * n0).sum(-1) / t.norm(dim=-1)
        assert cos.abs().max() < 1e-7, cos
    assert ((n0 * x0).sum(-1) < 0).all()
    assert torch.allclose(n0.norm(dim=-1), torch.ones(3, 6, dtype=torch.float64))


def test_flat_gaussians_have_the_surfel_normal():
    """s3 -> 0: the normal tends to the third rotation axis (the surfel's),
    turned to face the camera (here s3 = 1e-5 of the other scales' 0.05-0.25)."""
    means, quats, scales, opacities, colors, viewmat, K = _scene(6, seed=4, flat=True)
    mu, precision, *_ = project_gaussians(means, quats, scales, viewmat, K, W, H)
    rays = (torch.tensor([[10.0, 8.0, 1.0]], dtype=torch.float64) @ torch.linalg.inv(K).T)[:, None].expand(1, 6, 3)
    _, n = sample_depth_and_normal(rays, mu, precision)
    axis = (viewmat[:3, :3] @ quat_to_rotmat(quats))[:, :, 2]  # camera space
    assert ((n[0] * axis).sum(-1).abs() > 1 - 1e-6).all()


def _independent_render(means, quats, scales, opacities, colors, viewmat, K, antialiased):
    """A per-pixel loop over the Gaussians in centre-depth order, from
    gsplat's projection and the module doc's formulas written out again."""
    torch_impl = pytest.importorskip("gsplat.cuda._torch_impl")
    q = quats / quats.norm(dim=-1, keepdim=True)
    covars, precis = torch_impl._quat_scale_to_covar_preci(q, scales)
    _, means2d, depths, conics, comp = torch_impl._fully_fused_projection(
        means, covars, viewmat[None], K[None], W, H, eps2d=cv.EWA_DILATION, calc_compensations=antialiased
    )
    W3, t3 = viewmat[:3, :3], viewmat[:3, 3]
    mu = means @ W3.T + t3
    P = W3 @ precis @ W3.T
    order = torch.argsort(depths[0])
    m = lambda z: FAR / (FAR - NEAR) * (1 - NEAR / z)  # noqa: E731
    out = {
        k: torch.zeros(H, W, *s, dtype=torch.float64)
        for k, s in (("rgb", (3,)), ("alpha", ()), ("depth", ()), ("normal", (3,)), ("dist", ()), ("median", ()))
    }
    for i in range(H):
        for j in range(W):
            px = torch.tensor([j + 0.5, i + 0.5], dtype=torch.float64)
            d = torch.linalg.solve(K, torch.tensor([j + 0.5, i + 0.5, 1.0], dtype=torch.float64))
            T, ws, ms = 1.0, [], []
            for k in order.tolist():
                dx, dy = (px - means2d[0, k]).tolist()
                a, b, c = conics[0, k].tolist()
                o = float(opacities[k]) * (float(comp[0, k]) if antialiased else 1.0)
                alpha = min(cv.ALPHA_MAX, o * math.exp(-(0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy)))
                t = float(d @ P[k] @ mu[k]) / float(d @ P[k] @ d)
                if alpha < cv.ALPHA_MIN or t <= NEAR:
                    continue
                if T * (1 - alpha) < cv.TRANSMITTANCE_MIN:
                    break
                n = P[k] @ (2 * t * d - mu[k])
                n = -n if float(n @ (t * d)) > 0 else n
                w = alpha * T
                if T > cv.MEDIAN_TRANSMITTANCE:
                    out["median"][i, j] = t
                out["rgb"][i, j] += w * colors[k]
                out["depth"][i, j] += w * t
                out["normal"][i, j] += w * (W3.T @ (n / n.norm()))
                out["dist"][i, j] += sum(w * wj * (m(t) - mj) ** 2 for wj, mj in zip(ws, ms))
                ws.append(w)
                ms.append(m(t))
                T *= 1 - alpha
            out["alpha"][i, j] = 1 - T
    return out


@pytest.mark.parametrize("antialiased", [False, True])
def test_every_output_matches_an_independent_per_pixel_loop(antialiased):
    """rgb, alpha, expected and median depth, normals and the distortion
    against the loop above (no cumulative products, no chunks, the
    distortion as its O(n^2) definition)."""
    scene = _scene(7, seed=5)
    color, trans, depth, normal, dist, median = rasterize_reference_3dgs(
        *scene, W, H, NEAR, FAR, antialiased=antialiased
    )
    ref = _independent_render(*scene, antialiased)
    assert (ref["alpha"] > 0.3).sum() > 20  # the fixture covers a good part of the image
    for ours, theirs in (
        (color, ref["rgb"]),
        (1 - trans, ref["alpha"]),
        (depth, ref["depth"]),
        (normal, ref["normal"]),
        (dist, ref["dist"]),
        (median, ref["median"]),
    ):
        assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-11), (ours - theirs).abs().max()


def test_gradients_of_every_output_wrt_every_input_are_finite_differences():
    """float64 finite differences (torch.autograd.gradcheck) of a weighted
    sum of every output against every input, the camera (viewmat, K) and
    the screen-space centres included, for 3 Gaussians on 8x6 pixels."""
    means, quats, scales, opacities, colors, viewmat, K = _scene(3, seed=6)
    g = torch.Generator().manual_seed(7)
    weights = [
        torch.rand(s, generator=g, dtype=torch.float64) for s in ((6, 8, 3), (6, 8), (6, 8), (6, 8, 3), (6, 8), (6, 8))
    ]
    K = torch.tensor([[9.0, 0, 4.1], [0, 8.5, 2.9], [0, 0, 1]], dtype=torch.float64)  # all three in the 8x6 view

    def loss(means, quats, scales, opacities, colors, viewmat, K, means2d=None):
        outs = rasterize_reference_3dgs(
            means, quats, scales, opacities, colors, viewmat, K, 8, 6, NEAR, FAR, means2d=means2d, antialiased=True
        )
        return sum((w * o).sum() for w, o in zip(weights, outs))

    centre = project_gaussians(means, quats, scales, viewmat, K, 8, 6)[2].detach()
    inputs = [x.clone().requires_grad_(True) for x in (means, quats, scales, opacities, colors, viewmat, K)]
    loss(*inputs).backward()
    assert (inputs[0].grad.abs().sum(1) > 0).all()  # every Gaussian reaches the outputs
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)
    # means2d: its value pins the footprint (centre + (means2d - centre)), so
    # it is differentiated on its own, the rest held fixed: dL/d(centre).
    fixed = (means, quats, scales, opacities, colors, viewmat, K)
    assert torch.autograd.gradcheck(
        lambda m2d: loss(*fixed, means2d=m2d), [centre.clone().requires_grad_(True)], eps=1e-6, atol=1e-6, rtol=1e-5
    )
