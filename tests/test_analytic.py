"""Closed-form cases, on every backend available here."""

import pytest
import torch

import splat
from splat import conventions as cv

BACKENDS = ["cpu", "torch"]
f64 = torch.float64


def _facing(zs, opacities, scale=50.0, width=8, height=6, cx=3.5, cy=2.5, f=10.0):
    """Surfels facing a camera at the origin (identity viewmat), centred on the
    ray through pixel (row 2, col 3), whose centre is (3.5, 2.5) = (cx, cy)."""
    n = len(zs)
    means = torch.tensor([[0.0, 0.0, z] for z in zs], dtype=f64)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * n, dtype=f64)  # normal = +z
    scales = torch.full((n, 2), scale, dtype=f64)
    opac = torch.tensor(opacities, dtype=f64)
    colors = torch.rand(n, 3, generator=torch.Generator().manual_seed(0), dtype=f64)
    K = torch.tensor([[f, 0, cx], [0, f, cy], [0, 0, 1]], dtype=f64)
    return dict(
        means=means,
        quats=quats,
        scales=scales,
        opacities=opac,
        colors=colors,
        viewmat=torch.eye(4, dtype=f64),
        K=K,
        width=width,
        height=height,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_opaque_surfel_facing_the_camera(backend):
    s = _facing([2.5], [1.0])
    out = splat.rasterize(**s, backend=backend)
    # Huge surfel: G ~ 1 everywhere, alpha clamps at ALPHA_MAX.
    assert torch.allclose(out.alpha, torch.full_like(out.alpha, cv.ALPHA_MAX), atol=1e-3)
    assert float(out.alpha[2, 3]) == pytest.approx(cv.ALPHA_MAX, abs=1e-15)
    # A plane z = 2.5 facing the camera: every ray meets it at camera z = 2.5.
    assert torch.allclose(out.depth, torch.full_like(out.depth, 2.5), atol=1e-12)
    assert torch.allclose(out.median_depth, torch.full_like(out.depth, 2.5), atol=1e-12)
    # The normal +z points away from the camera, so it is flipped: (0, 0, -1) weighted by alpha.
    expected = torch.zeros(6, 8, 3, dtype=f64)
    expected[..., 2] = -out.alpha
    assert torch.allclose(out.normal, expected, atol=1e-12)
    assert float(out.distortion.abs().max()) == 0.0
    assert torch.allclose(out.rgb[2, 3], cv.ALPHA_MAX * s["colors"][0], atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_surfels_with_known_weights_give_the_exact_distortion(backend):
    near, far = 0.2, 100.0
    z1, z2, o1, o2 = 1.5, 4.0, 0.5, 0.6
    s = _facing([z2, z1], [o2, o1])  # given back to front: the rasterizer must sort
    out = splat.rasterize(**s, near=near, far=far, backend=backend)
    # At the pixel on the centres' ray u = v = 0, so G = 1 and alpha = opacity.
    w1, w2 = o1, o2 * (1 - o1)
    m = lambda z: far / (far - near) * (1 - near / z)  # noqa: E731
    assert float(out.distortion[2, 3]) == pytest.approx(w1 * w2 * (m(z1) - m(z2)) ** 2, rel=1e-12)
    assert float(out.alpha[2, 3]) == pytest.approx(w1 + w2, rel=1e-12)
    assert float(out.depth[2, 3]) == pytest.approx((w1 * z1 + w2 * z2) / (w1 + w2), rel=1e-12)
    # T before the second surfel is 0.5, not above 0.5: the median is the first.
    assert float(out.median_depth[2, 3]) == pytest.approx(z1, rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_ray_back_to_front_recurrence_with_many_layers(backend):
    """12 layers on one ray: values against a plain loop, gradients against float64 FD."""
    near, far = 0.2, 100.0
    zs = [1.0 + 0.37 * i for i in range(12)]
    opac = [0.15 + 0.05 * ((i * 7) % 5) for i in range(12)]
    s = _facing(zs, opac, width=1, height=1, cx=0.5, cy=0.5)
    bg = torch.tensor([0.1, 0.4, 0.7], dtype=f64)

    def loop(opac_t, zs_t, colors_t, bg_t):
        T, rgb, dsum, dist, A, D, D2 = 1.0, torch.zeros(3, dtype=f64), 0.0, 0.0, 0.0, 0.0, 0.0
        for o, z, c in zip(opac_t, zs_t, colors_t):
            w = o * T
            m = far / (far - near) * (1 - near / z)
            rgb = rgb + w * c
            dsum = dsum + w * z
            dist = dist + w * (m * m * A + D2 - 2 * m * D)
            A, D, D2 = A + w, D + w * m, D2 + w * m * m
            T = T * (1 - o)
        return rgb + T * bg_t, 1 - T, dsum / (1 - T), dist

    out = splat.rasterize(**s, near=near, far=far, background=bg, backend=backend)
    rgb, alpha, depth, dist = loop(s["opacities"], s["means"][:, 2], s["colors"], bg)
    assert torch.allclose(out.rgb[0, 0], rgb, rtol=1e-12)
    assert float(out.alpha[0, 0]) == pytest.approx(float(alpha), rel=1e-12)
    assert float(out.depth[0, 0]) == pytest.approx(float(depth), rel=1e-12)
    assert float(out.distortion[0, 0]) == pytest.approx(float(dist), rel=1e-12)

    # Gradients of each quantity w.r.t. opacities, depths, colours and background.
    params = {k: s[k].clone().requires_grad_(True) for k in ("means", "opacities", "colors")}
    bg_p = bg.clone().requires_grad_(True)
    out = splat.rasterize(
        params["means"],
        s["quats"],
        s["scales"],
        params["opacities"],
        params["colors"],
        s["viewmat"],
        s["K"],
        1,
        1,
        near=near,
        far=far,
        background=bg_p,
        backend=backend,
    )
    for name, value in (
        ("rgb", out.rgb[0, 0].sum()),
        ("alpha", out.alpha[0, 0]),
        ("depth", out.depth[0, 0]),
        ("distortion", out.distortion[0, 0]),
    ):
        wrt = [params["opacities"], params["means"], params["colors"], bg_p]
        grads = torch.autograd.grad(value, wrt, retain_graph=True, allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, wrt)]

        def f(o, z, c, b, name=name):
            r = loop(o, z, c, b)
            return {"rgb": r[0].sum(), "alpha": r[1], "depth": r[2], "distortion": r[3]}[name]

        h = 1e-6
        base = [s["opacities"], s["means"][:, 2], s["colors"], bg]
        for arg, analytic in zip(range(4), [grads[0], grads[1][:, 2], grads[2], grads[3]]):
            flat = base[arg].reshape(-1)
            for i in range(flat.numel()):
                plus = [b.clone() for b in base]
                minus = [b.clone() for b in base]
                plus[arg].reshape(-1)[i] += h
                minus[arg].reshape(-1)[i] -= h
                numeric = (f(*plus) - f(*minus)) / (2 * h)
                assert float(analytic.reshape(-1)[i]) == pytest.approx(float(numeric), rel=1e-5, abs=1e-8), (
                    name,
                    arg,
                    i,
                )


@pytest.mark.parametrize("backend", BACKENDS)
def test_off_centre_principal_point_moves_the_image(backend):
    """A surfel on the optical axis lands on the principal point wherever it is."""
    for cx, cy in ((3.5, 2.5), (5.5, 1.5), (0.5, 4.5)):
        s = _facing([2.0], [0.9], scale=0.02, cx=cx, cy=cy, f=40.0)
        out = splat.rasterize(**s, backend=backend)
        row, col = divmod(int(out.alpha.argmax()), 8)
        assert (col + 0.5, row + 0.5) == (cx, cy)
        assert torch.allclose(out.means2d[0], torch.tensor([cx, cy], dtype=f64))
