"""The fused C++ projection of 3D Gaussians (splat's
project_gaussians_forward_cpu / project_gaussians_backward_cpu, used by
splat.rasterize_3dgs on the CPU backend) against float64 central differences
and against the PyTorch projection it replaces there
(gaussian_kernel_inputs(..., fused=False), still the torch backend's and the
reference).

Finite differences: float64, h = 1e-6, |analytic - numeric| <= 1e-6 + 1e-5
|analytic| as in test_projection.py (the surfels' fused projection), for
every input with a gradient: means, quats, scales, opacities, viewmat and
every entry of K (through K^-1 too), plain and antialiased.  The precision
terms of a row (peak_num, peak_den, normal_slope, normal_base) are
Sigma^-1 up to a per-Gaussian factor whose gradient is zero by design (it
is held constant: the depth and normal they give do not change with it), so
the loss takes them divided by the row's peak_den[0]: a function they
define that does not depend on the factor either, and whose finite
differences are therefore comparable.

Parity with the PyTorch path: the same expressions, with sums taken in
another order (torch's batched matmuls against our loops, and our camera
gradient summed in float64 per block of Gaussians where torch sums float32
or float64 its own way), so they differ by rounding only.  Each column of
params and of every gradient is compared relative to its largest magnitude:
float64 to 1e-12 (observed <= 2e-15 over three seeds); float32 to 1e-5
(observed <= 8e-7, the viewmat gradient: a sum over ~3000 Gaussians, float32
in torch, and the conics' gradients go through det S = S_xx S_yy - S_xy^2,
which cancels for thin Gaussians).  Centres, depths, kept ids, pixel rectangles and radii are
equal.
"""

from __future__ import annotations

import pytest
import torch

from splat._backend import load_extension
from splat.rasterize_3dgs import gaussian_kernel_inputs, rasterize_3dgs
from splat.testing import intrinsics, look_at_viewmat, surface_scene

H_STEP = 1e-6
ATOL, RTOL = 1e-6, 1e-5
INPUTS = ("means", "quats", "scales", "opacities", "viewmat", "K")
NEAR, FAR = 0.2, 100.0
#: params columns holding Sigma^-1 up to a per-row factor (core.h kGaussPeakNum .. end)
PRECISION_COLUMNS = slice(6, 27)


def _scene(n=16, width=24, height=17, seed=3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    viewmat = look_at_viewmat((0.4, -0.3, -4.0), (0.0, 0.0, 0.0), dtype=dtype)
    cam = torch.cat(
        [(torch.rand(n, 2, generator=g, dtype=dtype) * 2 - 1) * 1.2, 3 + torch.rand(n, 1, generator=g, dtype=dtype)], 1
    )
    # beyond each of the four frustum limits of the EWA Jacobian (their gradient goes to K)
    cam[:4] = torch.tensor([[-4.0, 0.1, 3.0], [5.0, -0.2, 3.5], [0.2, -4.0, 3.0], [-0.1, 4.5, 4.0]], dtype=dtype)
    cam[4] = torch.tensor([0.0, 0.0, -1.0], dtype=dtype)  # behind the camera: culled, zero gradient
    W, t = viewmat[:3, :3], viewmat[:3, 3]
    scales = torch.rand(n, 3, generator=g, dtype=dtype) * 0.3 + 0.05
    scales[5, 2] = 1e-3  # nearly flat
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    quats = quats * (0.3 + 3 * torch.rand(n, 1, generator=g, dtype=dtype))  # assorted lengths
    return dict(
        means=(cam - t) @ W,  # W^T (cam - t), row by row
        quats=quats,
        scales=scales,
        opacities=torch.rand(n, generator=g, dtype=dtype) * 0.8 + 0.15,
        viewmat=viewmat,
        K=intrinsics(width, height, 60.0, (2.3, -1.4), 1.1, dtype=dtype),
        width=width,
        height=height,
    )


def _leaves(s):
    return {k: s[k].detach().clone().requires_grad_(True) for k in INPUTS}


def _project(s, p, antialiased, fused):
    return gaussian_kernel_inputs(*(p[k] for k in INPUTS), s["width"], s["height"], NEAR, FAR, antialiased, fused=fused)


def _weights(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) - 0.3).to(dtype)


def _terms(kin, invariant):
    """params and centre; ``invariant``: the precision columns divided by the
    row's peak_den[0] (module doc)."""
    params, centre = kin["params"], kin["centre"]
    if invariant:
        precision = params[:, PRECISION_COLUMNS] / params[:, 9:10]
        params = torch.cat([params[:, :6], precision], 1)
    return params, centre


def _loss(kin, invariant=False, scale=None):
    """A random weighted sum of params and centre.  ``scale``: each column's
    weights divided by these magnitudes (so that every term is O(1) and the
    finite differences' rounding, ~1e-16 |loss| / h, stays far below the
    tolerance)."""
    params, centre = _terms(kin, invariant)
    wp, wc = _weights(params.shape, params.dtype, 1), _weights(centre.shape, centre.dtype, 2)
    if scale is not None:
        wp, wc = wp / scale[0], wc / scale[1]
    return (wp * params).sum() + (wc * centre).sum()


def _magnitudes(kin, invariant):
    return [t.detach().abs().amax(0).clamp_min(1e-3) * t.shape[0] for t in _terms(kin, invariant)]


def test_scene_reaches_every_branch():
    """The finite-difference scene has Gaussians past each frustum limit (so
    K's gradient through the limits is checked) and a culled one."""
    s = _scene()
    cam = s["means"] @ s["viewmat"][:3, :3].T + s["viewmat"][:3, 3]
    fx, fy, cx, cy = s["K"][0, 0], s["K"][1, 1], s["K"][0, 2], s["K"][1, 2]
    u, v = cam[:, 0] / cam[:, 2], cam[:, 1] / cam[:, 2]
    tan_x, tan_y = 0.5 * s["width"] / fx, 0.5 * s["height"] / fy
    front = cam[:, 2] > NEAR
    assert bool((front & (u < -(cx / fx + 0.3 * tan_x))).any())
    assert bool((front & (u > (s["width"] - cx) / fx + 0.3 * tan_x)).any())
    assert bool((front & (v < -(cy / fy + 0.3 * tan_y))).any())
    assert bool((front & (v > (s["height"] - cy) / fy + 0.3 * tan_y)).any())
    assert not bool(front.all())


@pytest.mark.parametrize("antialiased", [False, True])
def test_finite_differences(antialiased):
    s = _scene()
    p = _leaves(s)
    kin = _project(s, p, antialiased, fused=True)
    scale = _magnitudes(kin, True)
    grads = torch.autograd.grad(_loss(kin, True, scale), [p[k] for k in INPUTS])
    culled = sorted(set(range(s["means"].shape[0])) - set(kin["ids"].tolist()))
    assert culled == [4]
    for key, analytic in zip(INPUTS, grads):
        flat = p[key].detach().reshape(-1)
        numeric = torch.zeros_like(flat)
        for i in range(flat.numel()):
            vals = []
            for sign in (1, -1):
                q = {k: v.detach().clone() for k, v in p.items()}
                q[key].reshape(-1)[i] += sign * H_STEP
                with torch.no_grad():
                    moved = _project(s, q, antialiased, fused=True)
                assert torch.equal(moved["ids"], kin["ids"]), (key, i)
                vals.append(_loss(moved, True, scale))
            numeric[i] = (vals[0] - vals[1]) / (2 * H_STEP)
        numeric = numeric.reshape(analytic.shape)
        err = (analytic - numeric).abs()
        assert bool((err <= ATOL + RTOL * analytic.abs()).all()), (key, float(err.max()))
        assert float(analytic.abs().max()) > 0, key
        if key in ("means", "quats", "scales", "opacities"):
            assert bool((analytic[4] == 0).all()), key  # the culled Gaussian


def _column_close(a, b, rel):
    """Each column (or the whole of a vector / matrix) within rel of its largest magnitude."""
    a, b = a.detach(), b.detach()
    if a.dim() == 2 and a.shape[0] > 4:
        scale = b.abs().amax(0).clamp_min(1e-30)
        return bool(((a - b).abs().amax(0) <= rel * scale).all())
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


@pytest.mark.parametrize("dtype,rel", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("antialiased", [False, True])
def test_matches_torch_projection(dtype, rel, antialiased):
    s = surface_scene(3000, 160, 120, dtype=dtype, seed=2)
    s["scales"] = torch.cat([s["scales"], 0.3 * s["scales"].amin(-1, keepdim=True)], 1)
    # culled by opacity, and by depth (behind the camera, beyond far), in C++ as in torch
    s["opacities"][::53] = 0.5 / 255
    s["means"][7::61] = -s["means"][7::61] + 4 * s["viewmat"][:3, :3].T @ -s["viewmat"][:3, 3]
    s["means"][11::67] *= 1e3
    results = []
    for fused in (True, False):
        p = _leaves(s)
        kin = _project(s, p, antialiased, fused)
        grads = torch.autograd.grad(_loss(kin), [p[k] for k in INPUTS])
        results.append((kin, grads))
    (a, ga), (b, gb) = results
    assert 2500 < a["params"].shape[0] < 2900
    for key in ("ids", "centre", "depth", "pixel_rect", "radii"):
        assert torch.equal(a[key], b[key]), key
    assert _column_close(a["params"], b["params"], rel)
    for key, x, y in zip(INPUTS, ga, gb):
        assert _column_close(x, y, rel), key
        assert float(y.abs().max()) > 0, key


def test_deterministic_across_threads():
    s = surface_scene(20000, 320, 240, dtype=torch.float32, seed=4)
    s["scales"] = torch.cat([s["scales"], 0.3 * s["scales"].amin(-1, keepdim=True)], 1)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            p = _leaves(s)
            kin = _project(s, p, True, fused=True)
            grads = torch.autograd.grad(_loss(kin), [p[k] for k in INPUTS])
            runs.append([kin[k] for k in ("params", "centre", "depth", "pixel_rect", "radii")] + list(grads))
    finally:
        torch.set_num_threads(before)
    for other in runs[1:]:
        assert all(torch.equal(x.detach(), y.detach()) for x, y in zip(runs[0], other))


def _op_args(s):
    ids = torch.arange(s["means"].shape[0])[[1, 3, 5, 6, 9, 12]]
    K_inv = torch.linalg.inv(s["K"])
    return (s["means"], s["quats"], s["scales"], s["opacities"], ids, s["viewmat"], s["K"], K_inv), ids


def test_backward_reads_strided_upstream_rows_in_place():
    """The backward reads v_params and v_centre as rows with any row stride
    (the same bits as from contiguous copies); a non-unit column stride is
    refused with the argument's name."""
    ext = load_extension()
    s = _scene()
    args, ids = _op_args(s)
    m = ids.shape[0]
    records = torch.randn(m, 40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    v_params, v_centre = records[:, 0:27], records[:, 30:32]
    tail = (s["width"], s["height"], False)
    strided = ext.project_gaussians_backward_cpu(*args, *tail, v_params, v_centre, True)
    copied = ext.project_gaussians_backward_cpu(*args, *tail, v_params.contiguous(), v_centre.contiguous(), True)
    assert len(strided) == 8
    for x, y in zip(strided, copied):
        assert torch.equal(x, y)
    assert float(strided[0].abs().max()) > 0
    with pytest.raises(RuntimeError, match="v_centre must have contiguous rows"):
        ext.project_gaussians_backward_cpu(*args, *tail, v_params, records[:, 30:34:2], True)


def test_bad_ids_are_refused():
    """The backward indexes the inputs and writes the gradients by id."""
    ext = load_extension()
    s = _scene()
    args, ids = _op_args(s)
    ups = (torch.zeros(ids.shape[0], 27, dtype=torch.float64), None, True)
    bad = ids.clone()
    bad[2] = s["means"].shape[0]
    tail = (s["width"], s["height"], False)
    with pytest.raises(RuntimeError, match=r"ids: every id must be in \[0, N\)"):
        ext.project_gaussians_backward_cpu(*args[:4], bad, *args[5:], *tail, *ups)
    with pytest.raises(RuntimeError, match="ids has dtype"):
        ext.project_gaussians_backward_cpu(*args[:4], ids.int(), *args[5:], *tail, *ups)


def test_rasterize_3dgs_projects_with_the_fused_op_on_the_cpu_backend_only():
    """backend="cpu" projects with the C++ op (with or without camera
    gradients), backend="torch" with PyTorch; the renders agree."""
    s = _scene(n=30, seed=4)
    colors = torch.rand(30, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ext = load_extension()
    calls = []
    original = ext.project_gaussians_forward_cpu

    def spy(*args):
        calls.append(1)
        return original(*args)

    ext.project_gaussians_forward_cpu = spy
    try:
        renders = []
        for backend in ("cpu", "torch"):
            p = _leaves(s)
            out = rasterize_3dgs(*(p[k] for k in INPUTS[:4]), colors, p["viewmat"], p["K"], 24, 17, backend=backend)
            assert len(calls) == 1
            grads = torch.autograd.grad(out.rgb.sum() + out.depth.sum(), [p[k] for k in INPUTS])
            renders.append((out, grads))
    finally:
        ext.project_gaussians_forward_cpu = original
    (a, ga), (b, gb) = renders
    assert float((a.rgb - b.rgb).detach().abs().max()) <= 1e-10 and torch.equal(a.radii, b.radii)
    for key, x, y in zip(INPUTS, ga, gb):
        assert float((x - y).abs().max()) <= 1e-9 * max(float(y.abs().max()), 1.0), key


@pytest.mark.parametrize("antialiased", [False, True])
def test_vector_blocks_match_one_gaussian_at_a_time(antialiased):
    """The C++ projection runs blocks of Gaussians through loops that the
    compiler vectorises (8 per AVX2 instruction in float32); a call with a
    single Gaussian runs the scalar code.  Both must give the same bits,
    forward and backward (all but the camera's gradient, a sum over the
    Gaussians): this catches any contraction into FMA or reassociation in the
    vector code, as test_projection.py does for the surfels."""
    ext = load_extension()
    s = surface_scene(300, 160, 120, dtype=torch.float32, seed=5)
    s["scales"] = torch.cat([s["scales"], 0.3 * s["scales"].amin(-1, keepdim=True)], 1)
    s["opacities"][::37] = 0.5 / 255  # some culled
    s["scales"][::41] *= 300.0  # some larger than the view
    n = s["means"].shape[0]
    K_inv = torch.linalg.inv(s["K"])
    cam = (s["viewmat"], s["K"], K_inv)
    g = torch.Generator().manual_seed(3)
    ups = torch.randn(n, 27, generator=g), torch.randn(n, 2, generator=g)

    def run(i, j):
        per = [t[i:j].contiguous() for t in (s["means"], s["quats"], s["scales"], s["opacities"])]
        fwd = ext.project_gaussians_forward_cpu(*per, *cam, s["width"], s["height"], NEAR, FAR, antialiased)
        ids = fwd[0]
        rows = [u[i:j][ids].contiguous() for u in ups]
        bwd = ext.project_gaussians_backward_cpu(*per, ids, *cam, s["width"], s["height"], antialiased, *rows, False)
        return [ids + i] + list(fwd[1:6]), list(bwd)

    whole_f, whole_b = run(0, n)
    singles = [run(i, i + 1) for i in range(n)]
    for k, t in enumerate(whole_f):
        assert torch.equal(t, torch.cat([one[0][k] for one in singles])), k
    for k, t in enumerate(whole_b):
        assert torch.equal(t, torch.cat([one[1][k] for one in singles])), k
    assert 250 < whole_f[0].shape[0] < n  # most kept, some culled
    assert int((whole_f[4][:, 2] > whole_f[4][:, 0]).sum()) > n // 2  # most are drawn
