"""The fused projection of 3D Gaussians on CUDA (splat/kernels/cuda/project.cu:
cull, then one thread per kept Gaussian each way), executed on the CPU under
emulation, against the CPU's fused op (cpu/project_gaussians_cpu.cpp).

Both run the one per-Gaussian maths of splat/kernels/project_gaussians.h
(the CPU in vectorised blocks of 64, the GPU one Gaussian per thread) with no
FMA contraction on either side and the same libm under emulation.  Every
Gaussian is independent, and the one sum over Gaussians, the camera's
gradient, is taken in float64 over the same fixed blocks in the same order on
both, so every output, ids included, and every gradient must be BITWISE
equal: any difference is a bug, not rounding.  The CPU op itself
is checked against finite differences and the torch projection in
tests/test_project_gaussians.py.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_emulation import FAR, NEAR, emu  # noqa: F401 (fixture)
from test_cuda_emulation_project import assert_swap_is_bitwise, render_with_grads, swap_kernels

from splat._backend import load_extension
from splat.rasterize_3dgs import rasterize_3dgs
from splat.testing import intrinsics, look_at_viewmat

DTYPES = (torch.float64, torch.float32)
FORWARD_NAMES = ("ids", "params", "centre", "depth", "pixel_rect", "radii", "non-finite count")
BACKWARD_NAMES = ("v_means", "v_quats", "v_scales", "v_opacities", "v_means2d")
CAMERA_NAMES = ("v_viewmat", "v_K", "v_K_inv")


@pytest.fixture(scope="module")
def cpu():
    return load_extension()


def scene(n, dtype, seed=3, width=53, height=37, culled=True):
    """n Gaussians (over one 256-thread block, not a multiple of 64) placed in
    camera space, with the cases the kernels branch on: beyond each frustum
    limit of the EWA Jacobian, off screen, larger than the view, nearly flat,
    quaternions of assorted lengths and one tiny; with ``culled``, also some
    behind the camera, closer than near, beyond far and with opacity under
    1/255 (culled by the projection)."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    xy = (torch.rand(n, 2, generator=g, dtype=f64) * 2 - 1) * 1.5
    cam = torch.cat([xy, 3 + 4 * torch.rand(n, 1, generator=g, dtype=f64)], 1)
    cam[:4] = torch.tensor([[-4.0, 0.1, 3.0], [5.0, -0.2, 3.5], [0.2, -4.0, 3.0], [-0.1, 4.5, 4.0]], dtype=f64)
    cam[4:8, 0] += 40.0  # off screen, in the depth range: kept, draws nothing
    opacities = torch.rand(n, generator=g, dtype=f64) * 0.8 + 0.15
    dropped = set()
    if culled:
        cam[8, 2] = -1.0  # behind the camera
        cam[9, 2] = 0.5 * NEAR  # closer than near
        cam[10, 2] = 2 * FAR  # beyond far
        run = range(n // 2, n // 2 + n // 30)
        cam[run.start : run.stop, 2] = -2.0  # a run of culled ones in the middle
        faint = [11, n // 4 + 1, n - 2]
        opacities[faint] = 0.5 / 255  # too faint to draw
        dropped = {8, 9, 10, *run, *faint}
    viewmat = look_at_viewmat((0.4, -0.3, -4.0), (0.0, 0.0, 0.0), dtype=f64)
    W, t = viewmat[:3, :3], viewmat[:3, 3]
    scales = torch.rand(n, 3, generator=g, dtype=f64) * 0.3 + 0.05
    scales[12, 2] = 1e-3  # nearly flat
    scales[13:16] *= 60.0  # larger than the view
    quats = torch.randn(n, 4, generator=g, dtype=f64) * (0.3 + 3 * torch.rand(n, 1, generator=g, dtype=f64))
    quats[16] *= 1e-6  # short: divided by its largest component first
    s = dict(
        means=(cam - t) @ W,
        quats=quats,
        scales=scales,
        opacities=opacities,
        viewmat=viewmat,
        K=intrinsics(width, height, 60.0, (2.3, -1.4), 1.1, dtype=f64),
    )
    s = {k: v.to(dtype) for k, v in s.items()}
    s["K_inv"] = torch.linalg.inv(s["K"])
    s.update(width=width, height=height, dropped=dropped)
    return s


def forward_args(s, antialiased):
    tensors = tuple(s[k] for k in ("means", "quats", "scales", "opacities", "viewmat", "K", "K_inv"))
    return (*tensors, s["width"], s["height"], NEAR, FAR, antialiased)


def backward_args(s, ids, antialiased, v_params, v_centre, with_camera=False):
    tensors = (s["means"], s["quats"], s["scales"], s["opacities"], ids, s["viewmat"], s["K"], s["K_inv"])
    return (*tensors, s["width"], s["height"], antialiased, v_params, v_centre, with_camera)


def upstream(m, dtype, seed=11):
    """v_params and v_centre as the rasterizer and autograd hand them over:
    column slices of one record (the CUDA op makes them contiguous)."""
    records = torch.randn(m, 31, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return records[:, :27], records[:, 28:30]


BITS = {torch.float64: torch.int64, torch.float32: torch.int32}


def assert_bitwise(emulated, reference, names):
    """Same dtype, shape and bits (NaNs included: the non-finite rows')."""
    assert len(emulated) == len(reference) == len(names)
    for name, a, b in zip(names, emulated, reference):
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        bits = BITS.get(a.dtype, a.dtype)
        assert torch.equal(a.view(bits), b.view(bits)), f"{name}: {int((a.view(bits) != b.view(bits)).sum())} differ"


@pytest.mark.parametrize("culled", [True, False], ids=["culled", "all-kept"])
@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "aa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_forward_and_backward_bitwise_equal_to_cpu(emu, cpu, dtype, antialiased, culled):  # noqa: F811 (fixture)
    n = 301
    s = scene(n, dtype, culled=culled)
    args = forward_args(s, antialiased)
    ref = cpu.project_gaussians_forward_cpu(*args)
    out = emu.project_gaussians_forward(*args)
    assert_bitwise(out, ref, FORWARD_NAMES)
    ids, rect = ref[0], ref[4]
    m = ids.shape[0]
    if culled:
        assert len(s["dropped"]) == 16 and ids.tolist() == sorted(set(range(n)) - s["dropped"])
    else:
        assert torch.equal(ids, torch.arange(n))
    drawn = int(((rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])).sum())
    assert 200 < drawn < m  # most drawn, the off-screen ones not
    assert int(ref[6]) == 0 and out[6].dim() == 0

    v_params, v_centre = upstream(m, dtype)
    for centre, with_camera in ((v_centre, True), (None, False), (None, True)):
        bargs = backward_args(s, ids, antialiased, v_params, centre, with_camera)
        ref_b = cpu.project_gaussians_backward_cpu(*bargs)
        out_b = emu.project_gaussians_backward(*bargs)
        assert_bitwise(out_b, ref_b, BACKWARD_NAMES + CAMERA_NAMES[: 3 * with_camera])
        assert all(float(t.abs().max()) > 0 for t in ref_b)
        kept = torch.zeros(n, dtype=torch.bool)
        kept[ids] = True
        assert all(not t[~kept].any() for t in out_b[:5])  # the culled get exactly zero


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_non_finite_rows_are_counted_like_the_cpu(emu, cpu, dtype):  # noqa: F811 (fixture)
    """Rows whose parameters the dtype cannot carry are counted (the device's
    atomic count equals the CPU's), and rasterize_3dgs then raises the
    error naming the rows."""
    s = scene(70, dtype, seed=5)
    big = 1e200 if dtype == torch.float64 else 1e30  # their covariance overflows
    s["scales"][[20, 33, 47]] = big
    args = forward_args(s, False)
    ref = cpu.project_gaussians_forward_cpu(*args)
    out = emu.project_gaussians_forward(*args)
    assert_bitwise(out, ref, FORWARD_NAMES)
    assert int(ref[6]) == 3 and out[6].dtype == torch.int64


def test_no_gaussians(emu, cpu):  # noqa: F811 (fixture)
    s = scene(20, torch.float64)
    empty = {k: (v[:0] if k in ("means", "quats", "scales", "opacities") else v) for k, v in s.items()}  # fmt: skip
    args = forward_args(empty, True)
    out = emu.project_gaussians_forward(*args)
    assert_bitwise(out, cpu.project_gaussians_forward_cpu(*args), FORWARD_NAMES)
    assert out[0].shape == (0,)
    v_params, v_centre = upstream(0, torch.float64)
    bargs = backward_args(empty, out[0], True, v_params, v_centre, True)
    ref_b = cpu.project_gaussians_backward_cpu(*bargs)
    assert_bitwise(emu.project_gaussians_backward(*bargs), ref_b, BACKWARD_NAMES + CAMERA_NAMES)


def test_all_culled(emu, cpu):  # noqa: F811 (fixture)
    s = scene(40, torch.float32)
    s["opacities"] = torch.full_like(s["opacities"], 0.1 / 255)
    args = forward_args(s, False)
    out = emu.project_gaussians_forward(*args)
    assert_bitwise(out, cpu.project_gaussians_forward_cpu(*args), FORWARD_NAMES)
    assert out[0].shape == (0,)


def _swap_projection(monkeypatch, emu):  # noqa: F811 (fixture value)
    """rasterize_3dgs's fused projection runs the emulated CUDA kernels."""
    return swap_kernels(
        monkeypatch,
        "project_gaussians_forward_cpu",
        emu.project_gaussians_forward,
        "project_gaussians_backward_cpu",
        emu.project_gaussians_backward,
    )


@pytest.mark.parametrize("camera_grad", [False, True], ids=["", "camera-grad"])
@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "aa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_rasterize_3dgs_with_emulated_projection_is_bitwise_the_cpu(emu, monkeypatch, dtype, antialiased, camera_grad):  # noqa: F811,E501
    """splat.rasterize_3dgs end to end (some Gaussians culled): every output
    and every input gradient (means, quats, scales, opacities, colours,
    means2d, and with camera_grad viewmat and K) bitwise equal with the
    projection's CUDA kernels in place of the CPU op."""
    s = scene(120, dtype, seed=7, width=64, height=48)
    colors = torch.rand(120, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)

    run = lambda: render_with_grads(rasterize_3dgs, s, colors, dtype, camera_grad, antialiased=antialiased)  # noqa: E731
    assert_swap_is_bitwise(run, lambda: _swap_projection(monkeypatch, emu))


def test_rasterize_3dgs_raises_for_non_finite_rows(emu, monkeypatch):  # noqa: F811 (fixture)
    s = scene(40, torch.float32, seed=2)
    s["scales"][17] = 1e30
    calls = _swap_projection(monkeypatch, emu)
    kw = {k: s[k] for k in ("means", "quats", "scales", "opacities", "viewmat", "K", "width", "height")}
    with pytest.raises(ValueError, match=r"Gaussians at rows \[17\] are too thin or too large"):
        rasterize_3dgs(**kw, colors=torch.ones(40, 3), near=NEAR, far=FAR, backend="cpu")
    assert calls == ["fwd"]


def test_bad_inputs_name_the_argument(emu):  # noqa: F811 (fixture)
    s = scene(20, torch.float64)
    args = list(forward_args(s, False))

    def fails(index, value, message):
        wrong = list(args)
        wrong[index] = value
        with pytest.raises(RuntimeError, match=message):
            emu.project_gaussians_forward(*wrong)

    fails(1, s["quats"][:, :3].contiguous(), r"quats has shape \[20, 3\], expected \[20, 4\]")
    fails(2, s["scales"][:, :2].contiguous(), r"scales has shape \[20, 2\], expected \[20, 3\]")
    fails(2, s["scales"].float(), "scales has dtype Float, expected Double")
    fails(3, s["opacities"][:19], r"opacities has shape \[19\], expected 20 rows")
    fails(4, s["viewmat"][:3].contiguous(), r"viewmat has shape \[3, 4\], expected \[4, 4\]")
    fails(1, s["quats"].t().contiguous().t(), "quats must be contiguous")
    fails(6, s["K_inv"].float(), "K_inv has dtype Float, expected Double")
    ids = emu.project_gaussians_forward(*args)[0]
    v_params, v_centre = upstream(ids.shape[0], torch.float64)
    bargs = list(backward_args(s, ids, False, v_params, v_centre))
    with pytest.raises(RuntimeError, match="ids has dtype Int, expected Long"):
        emu.project_gaussians_backward(*bargs[:4], ids.int(), *bargs[5:])
    with pytest.raises(RuntimeError, match=r"v_centre has shape \[3, 2\], expected \d+ rows"):
        emu.project_gaussians_backward(*bargs[:12], v_centre[:3], False)
