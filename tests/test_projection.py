"""The fused C++ projection (splat._C.project_forward_cpu / project_backward_cpu,
used by splat.rasterize for CPU tensors when viewmat and K need no gradient)
against float64 central differences and against the torch projection it
replaces (rasterize._project + _surfel_colors, still used for CUDA tensors,
for viewmat/K gradients and by the reference backend).

Tolerances: float64 finite differences with h = 1e-6 as in
test_finite_differences.py (|analytic - numeric| <= 1e-6 + 1e-5 |analytic|).
Parity with the torch path: the two compute the same expressions in another
order (torch's batched matmuls, our scalar loops), so values agree to a few
float rounding steps, relative 1e-12 in float64 and 2e-6 in float32 of each
array's largest magnitude; pixel rectangles and radii (float64 bounds with a
one-pixel margin) are equal.
"""

import importlib

import pytest
import torch

from splat._backend import load_extension
from splat.testing import random_scene, surface_scene

R = importlib.import_module("splat.rasterize")  # the module (splat.rasterize is also the function)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

H_STEP = 1e-6
ATOL, RTOL = 1e-6, 1e-5
DEGREES = (None, 0, 1, 2, 3)


def _scene(n=12, dtype=torch.float64, seed=3):
    s = random_scene(n, 24, 17, dtype=dtype, seed=seed, principal_offset=(4.3, -3.1), aspect=1.15)
    g = torch.Generator().manual_seed(seed)
    # one culled surfel (behind the near plane), quaternions of assorted lengths
    s["means"][0] = torch.tensor([0.0, 0.0, -3.95], dtype=dtype)
    s["quats"] = s["quats"] * (0.3 + 3 * torch.rand(n, 1, generator=g, dtype=torch.float64)).to(dtype)
    s["sh"] = (0.3 * torch.randn(n, 16, 3, generator=g, dtype=torch.float64)).to(dtype)
    s["sh"][:, 0] += 1.5  # colours stay away from the clamp at 0
    return s


def forward_args(s, deg):
    """The fused projection op's arguments up to its upstream gradients (the
    forward takes the magnitude limits after them, the backward the gradients),
    for a scene with SH coefficients in s["sh"]; deg None: no SH colour."""
    coeffs = s["sh"] if deg is not None else s["sh"].new_zeros(0, 0, 3)
    return (
        s["means"],
        s["quats"],
        s["scales"],
        s["opacities"],
        coeffs,
        -1 if deg is None else deg,
        s["viewmat"],
        s["K"],
        s["width"],
        s["height"],
        0.2,
        100.0,
    )


def _fused(s, params, deg, means2d):
    coeffs = params["sh"] if deg is not None else params["sh"].new_zeros(0, 0, 3)
    return R._ProjectSurfels.apply(
        params["means"],
        params["quats"],
        params["scales"],
        s["opacities"],
        coeffs,
        means2d,
        s["viewmat"],
        s["K"],
        s["width"],
        s["height"],
        0.2,
        100.0,
        -1 if deg is None else deg,
    )


def _torch(s, params, deg, means2d):
    """The torch path with means2d folded in as rasterize() does."""
    proj = R._project(
        params["means"],
        params["quats"],
        params["scales"],
        s["opacities"],
        s["viewmat"],
        s["K"],
        s["width"],
        s["height"],
        0.2,
        100.0,
    )
    delta = means2d - means2d.detach()
    M = proj["Tuvw"]
    Tuvw = torch.cat([M[:, 0:3] + delta[:, :1] * M[:, 6:9], M[:, 3:6] + delta[:, 1:] * M[:, 6:9], M[:, 6:9]], 1)
    color = R._surfel_colors(params["means"], params["sh"], s["viewmat"], deg) if deg is not None else None
    return Tuvw, proj["center"] + delta, proj["normal"], color, proj["depth"], proj["pixel_rect"], proj["radii"]


def _translated(outs, m2):
    """The footprint moved by m2 in screen space, as rasterize() folds means2d in."""
    outs = list(outs)
    Tw = outs[0][:, 6:9]
    outs[0] = torch.cat([outs[0][:, 0:3] + m2[:, :1] * Tw, outs[0][:, 3:6] + m2[:, 1:] * Tw, Tw], 1)
    outs[1] = outs[1] + m2
    return outs


def _leaves(s):
    return {k: s[k].detach().clone().requires_grad_(True) for k in ("means", "quats", "scales", "sh")}


def _weighted(outs, deg, seed=1):
    g = torch.Generator().manual_seed(seed)
    total = 0
    for t in outs[:4]:
        if t is None or t.numel() == 0:
            continue
        w = torch.rand(t.shape, generator=g, dtype=torch.float64).to(t.dtype) - 0.3
        total = total + (w * t).sum()
    return total


@pytest.mark.parametrize("deg", DEGREES)
def test_finite_differences(deg):
    """Every differentiable output (Tuvw, centre, normal, colour) w.r.t. every
    input (means, quats, scales, SH coefficients, means2d)."""
    s = _scene()
    params = _leaves(s)
    means2d = torch.zeros(s["means"].shape[0], 2, dtype=torch.float64, requires_grad=True)
    loss = _weighted(_fused(s, params, deg, means2d), deg)
    keys = list(params) if deg is not None else ["means", "quats", "scales"]
    grads = torch.autograd.grad(loss, [params[k] for k in keys] + [means2d])
    for key, analytic in zip(keys + ["means2d"], grads):
        src = means2d if key == "means2d" else params[key]
        flat = src.detach().reshape(-1)
        numeric = torch.zeros_like(flat)
        for i in range(flat.numel()):
            vals = []
            for sign in (1, -1):
                p = {k: v.detach().clone() for k, v in params.items()}
                m2 = means2d.detach().clone()
                (m2 if key == "means2d" else p[key]).reshape(-1)[i] += sign * H_STEP
                with torch.no_grad():
                    vals.append(_weighted(_translated(_fused(s, p, deg, m2), m2), deg))
            numeric[i] = (vals[0] - vals[1]) / (2 * H_STEP)
        numeric = numeric.reshape(src.shape)
        err = (analytic - numeric).abs()
        assert bool((err <= ATOL + RTOL * analytic.abs()).all()), (key, float(err.max()))
        assert float(analytic.abs().max()) > 0, key


def _close(a, b, rel):
    scale = max(float(b.abs().max()), 1e-30)
    return float((a - b).abs().max()) <= rel * scale


@pytest.mark.parametrize("dtype,rel", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("deg", DEGREES)
def test_matches_torch_projection(dtype, rel, deg):
    s = surface_scene(3000, 160, 120, dtype=dtype, seed=2)
    g = torch.Generator().manual_seed(0)
    n = s["means"].shape[0]
    s["sh"] = (0.3 * torch.randn(n, 16, 3, generator=g)).to(dtype)
    results = []
    for fn in (_fused, _torch):
        params = _leaves(s)
        means2d = torch.zeros(n, 2, dtype=dtype, requires_grad=True)
        outs = fn(s, params, deg, means2d)
        loss = _weighted(outs, deg)
        keys = list(params) if deg is not None else ["means", "quats", "scales"]
        grads = torch.autograd.grad(loss, [params[k] for k in keys] + [means2d])
        results.append((outs, grads))
    (fo, fg), (to, tg) = results
    for a, b in zip(fo[:5], to[:5]):
        if b is not None:
            assert _close(a.detach(), b.detach(), rel)
    assert torch.equal(fo[5], to[5]) and torch.equal(fo[6], to[6])  # pixel rectangles, radii
    for a, b in zip(fg, tg):
        assert _close(a, b, rel)


def test_deterministic_across_threads():
    s = surface_scene(20000, 320, 240, dtype=torch.float32, seed=4)
    n = s["means"].shape[0]
    s["sh"] = 0.3 * torch.randn(n, 16, 3, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            params = _leaves(s)
            means2d = torch.zeros(n, 2, requires_grad=True)
            outs = _fused(s, params, 3, means2d)
            grads = torch.autograd.grad(_weighted(outs, 3), list(params.values()) + [means2d])
            runs.append([o.detach() for o in outs] + list(grads))
    finally:
        torch.set_num_threads(before)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("deg", [None, 3])
def test_vector_blocks_match_one_surfel_at_a_time(deg):
    """The C++ projection runs blocks of surfels through loops that the
    compiler vectorises (8 surfels per AVX2 instruction); a call with a single
    surfel runs the scalar code.  Both must give the same bits, forward and
    backward: this catches any contraction into FMA or reassociation in the
    vector code (GCC 12 fuses some lane pairs into vfmaddsub in its AVX-512
    clone despite -ffp-contract=off, hence that clone is not built)."""
    ext = load_extension()
    s = surface_scene(300, 160, 120, dtype=torch.float32, seed=5)
    n = s["means"].shape[0]
    g = torch.Generator().manual_seed(3)
    s["means"][::37, 2] = -1.0  # some culled (behind the camera)
    s["scales"][::41] *= 300.0  # some larger than the view
    coeffs = (0.3 * torch.randn(n, 16, 3, generator=g)) if deg is not None else torch.zeros(0, 0, 3)
    d = -1 if deg is None else deg
    cam = (s["viewmat"], s["K"], s["width"], s["height"], 0.2, 100.0)
    limits = R._magnitude_limits(torch.float32)
    ups = [torch.randn(n, k, generator=g) for k in (9, 2, 3, 3)]

    def run(i, j):
        per = [t[i:j] for t in (s["means"], s["quats"], s["scales"], s["opacities"])]
        c = coeffs[i:j] if deg is not None else coeffs
        fwd = ext.project_forward_cpu(*per, c, d, *cam, *limits)
        bwd = ext.project_backward_cpu(*per, c, d, *cam, *(u[i:j] for u in ups))
        return list(fwd[:7]), list(bwd), int(fwd[7])

    whole_f, whole_b, whole_bad = run(0, n)
    singles = [run(i, i + 1) for i in range(n)]
    for k, t in enumerate(whole_f):
        if t.numel():
            assert torch.equal(t, torch.cat([one[0][k] for one in singles])), k
    for k, t in enumerate(whole_b):
        if t.numel():
            assert torch.equal(t, torch.cat([one[1][k] for one in singles])), k
    assert whole_bad == sum(one[2] for one in singles)
    assert int((whole_f[5][:, 2] > whole_f[5][:, 0]).sum()) > n // 2  # most are drawn


def test_rasterize_uses_fused_path_only_without_camera_gradients():
    """viewmat/K with requires_grad take the torch projection (their gradients
    are sums over surfels); both paths render the same image."""
    s = surface_scene(2000, 96, 64, dtype=torch.float64, seed=1)
    ext = load_extension()
    calls = []
    original = ext.project_forward_cpu

    def spy(*args):
        calls.append(1)
        return original(*args)

    ext.project_forward_cpu = spy
    try:
        kw = {k: s[k] for k in ("means", "quats", "scales", "opacities", "colors", "width", "height")}
        a = R.rasterize(**kw, viewmat=s["viewmat"], K=s["K"], backend="cpu")
        assert len(calls) == 1
        b = R.rasterize(**kw, viewmat=s["viewmat"].clone().requires_grad_(True), K=s["K"], backend="cpu")
        assert len(calls) == 1
    finally:
        ext.project_forward_cpu = original
    assert _close(a.rgb, b.rgb.detach(), 1e-12) and torch.equal(a.radii, b.radii)


@pytest.mark.parametrize("deg", [None, 2])
def test_backward_reads_strided_upstream_rows_in_place(deg):
    """project_backward_cpu reads its upstream gradients as rows with any row
    stride (the rasterizer hands them over as column slices of its [N, 18]
    records): the same bits as from contiguous copies; a non-unit column
    stride is refused with the argument's name."""
    ext = load_extension()
    s = _scene(20)
    n = s["means"].shape[0]
    records = torch.randn(n, 18, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    slices = (records[:, 0:9], records[:, 9:11], records[:, 11:14], records[:, 14:17])
    assert slices[0].stride() == (18, 1)
    args = forward_args(s, deg)
    strided = ext.project_backward_cpu(*args, *slices)
    copied = ext.project_backward_cpu(*args, *(t.contiguous() for t in slices))
    for a, b in zip(strided, copied):
        assert torch.equal(a, b)
    assert float(strided[0].abs().max()) > 0
    with pytest.raises(RuntimeError, match="v_center must have contiguous rows"):
        ext.project_backward_cpu(*args, slices[0], records[:, 9:13:2], *slices[2:])
