"""The fused surfel projection's CUDA kernels (splat/kernels/cuda/project.cu),
executed on the CPU under emulation, against the CPU's fused projection
(cpu/project_cpu.cpp).

Both run the one per-surfel maths of splat/kernels/project_surfels.h, the
CPU in vectorised blocks of 64 surfels, the GPU one surfel per thread, with
no FMA contraction on either side (-ffp-contract=off; nvcc --fmad=false) and
the same libm under emulation.  Every surfel is independent (the backward
has no atomics; the forward's only shared result is the over-limit count), so
forward AND backward must be BITWISE equal: any difference is a bug, not
rounding.  The CPU op itself is checked against finite differences and the
torch projection in tests/test_projection.py.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from test_cuda_emulation import FAR, NEAR, emu  # noqa: F401 (fixture)
from test_projection import forward_args

import splat
from splat import _backend
from splat._backend import load_extension
from splat.testing import random_scene

R = importlib.import_module("splat.rasterize")  # the module (splat.rasterize is also the function)

DTYPES = (torch.float64, torch.float32)
DEGREES = (None, 0, 1, 2, 3)


@pytest.fixture(scope="module")
def cpu():
    return load_extension()


def scene(n, dtype, seed=3, width=53, height=37):
    """n surfels (over one 256-thread block and not a multiple of 64) with
    every case the kernels branch on: culled behind the near plane and beyond
    the far plane, one at the camera centre (the SH direction's clamp), off
    screen, larger than the view, quaternions of assorted lengths, SH
    coefficients beyond degree 3 (whose gradient must be zero)."""
    s = random_scene(n, width, height, dtype=torch.float64, seed=seed, principal_offset=(4.3, -3.1), aspect=1.15)
    g = torch.Generator().manual_seed(seed)
    s["means"][0] = torch.tensor([0.0, 0.0, -3.95], dtype=torch.float64)  # behind the near plane
    s["means"][1] = torch.tensor([0.0, 0.0, 200.0], dtype=torch.float64)  # beyond the far plane
    campos = -s["viewmat"][:3, :3].T @ s["viewmat"][:3, 3]
    s["means"][2] = campos  # at the camera centre: culled, SH direction clamped
    s["means"][3:9, 0] += 30.0  # off screen, in the depth range
    s["scales"][9:13] *= 400.0  # larger than the view
    s["quats"] = s["quats"] * (0.3 + 3 * torch.rand(n, 1, generator=g, dtype=torch.float64))
    s["quats"][13] *= 1e-6  # a short quaternion (divided by its largest component first)
    s["sh"] = 0.3 * torch.randn(n, 20, 3, generator=g, dtype=torch.float64)
    s["sh"][:, 0] += 0.2
    s["sh"][::5, 0] -= 3.0  # some colours clamped at 0 (their gradient stops)
    return {k: (v.to(dtype) if torch.is_tensor(v) else v) for k, v in s.items()}


def upstream(n, dtype, seed=11):
    """Upstream gradients as the rasterizer hands them over: column slices of
    one [N, 18] record."""
    records = torch.randn(n, 18, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return records[:, 0:9], records[:, 9:11], records[:, 11:14], records[:, 14:17]


def assert_bitwise(emulated, reference, names):
    assert len(emulated) == len(reference) == len(names)
    for name, a, b in zip(names, emulated, reference):
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), f"{name}: largest difference {float((a.double() - b.double()).abs().max()):.3g}"


FORWARD_NAMES = ("Tuvw", "center", "normal", "color", "depth", "pixel_rect", "radii", "over-limit count")
BACKWARD_NAMES = ("v_means", "v_quats", "v_scales", "v_coeffs", "v_means2d")


@pytest.mark.parametrize("deg", DEGREES, ids=lambda d: f"sh{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_forward_and_backward_bitwise_equal_to_cpu(emu, cpu, dtype, deg):  # noqa: F811 (fixture)
    s = scene(301, dtype)
    args = forward_args(s, deg)
    limits = R._magnitude_limits(dtype)
    ref = cpu.project_forward_cpu(*args, *limits)
    out = emu.project_forward(*args, *limits)
    assert_bitwise(out, ref, FORWARD_NAMES)
    rect = ref[5]
    drawn = int(((rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])).sum())
    assert 150 < drawn < 301  # most drawn, the culled and off-screen ones not
    assert int(ref[7]) == 0

    ups = upstream(301, dtype)
    ref_b = cpu.project_backward_cpu(*args, *ups)
    out_b = emu.project_backward(*args, *ups)
    assert_bitwise(out_b, ref_b, BACKWARD_NAMES)
    assert all(float(t.abs().max()) > 0 for t in ref_b if t.numel())
    if deg is not None:  # the coefficients beyond the degree get exactly zero
        assert not ref_b[3][:, (deg + 1) ** 2 :].any() and ref_b[3][:, : (deg + 1) ** 2].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_over_limit_surfels_are_counted_like_the_cpu(emu, cpu, dtype):  # noqa: F811 (fixture)
    """Surfels whose screen matrix the dtype cannot carry are counted (the
    device's atomic count equals the CPU's), and splat.rasterize then raises
    the torch path's error naming the rows."""
    s = scene(70, dtype, seed=5)
    big = 1e80 if dtype == torch.float64 else 1e9  # over max^(1/4) / 16 = 8e75 and 2.7e8 px
    s["scales"][[20, 33, 47]] = big  # in the depth range and drawn: over the drawn limit
    args = forward_args(s, 1)
    limits = R._magnitude_limits(dtype)
    ref = cpu.project_forward_cpu(*args, *limits)
    out = emu.project_forward(*args, *limits)
    assert_bitwise(out, ref, FORWARD_NAMES)
    assert int(ref[7]) == 3 and out[7].dtype == torch.int64 and out[7].dim() == 0


def swap_kernels(monkeypatch, forward_name, forward, backward_name, backward):
    """The kernels load_extension() returns become the CPU's with
    forward_name and backward_name replaced (by emulated CUDA kernels: the
    fused projections' on CPU tensors run as on a GPU, the raster kernels stay
    the CPU's).  Returns the list of calls made ("fwd", "bwd")."""
    real = load_extension()
    calls = []
    swapped = {forward_name: ("fwd", forward), backward_name: ("bwd", backward)}

    class Kernels:
        def __getattr__(self, name):
            if name not in swapped:
                return getattr(real, name)
            label, op = swapped[name]
            return lambda *a: (calls.append(label), op(*a))[1]

    monkeypatch.setattr(_backend, "load_extension", Kernels)
    return calls


def _swap_projection(monkeypatch, emu):  # noqa: F811 (fixture value)
    """splat.rasterize's fused projection runs the emulated CUDA kernels."""
    return swap_kernels(
        monkeypatch, "project_forward_cpu", emu.project_forward, "project_backward_cpu", emu.project_backward
    )


def random_loss(out, dtype):
    """A fixed random weighting of every image output (so that every gradient path is taken)."""
    g = torch.Generator().manual_seed(1)
    return sum(
        ((torch.rand(t.shape, generator=g, dtype=torch.float64).to(dtype) - 0.3) * t).sum()
        for t in (out.rgb, out.alpha, out.depth, out.normal, out.distortion)
    )


def render_with_grads(render, s, colors, dtype, camera_grad=False, **options):
    """render (splat.rasterize or rasterize_3dgs, backend "cpu") of scene s
    with fresh leaves (viewmat and K too with camera_grad): returns (output,
    {input: gradient of random_loss}), means2d's included."""
    names = ("means", "quats", "scales", "opacities") + (("viewmat", "K") if camera_grad else ())
    leaves = {k: s[k].detach().clone().requires_grad_(True) for k in names}
    leaves["colors"] = colors.detach().clone().requires_grad_(True)
    cam = {k: s[k] for k in ("viewmat", "K", "width", "height") if k not in leaves}
    out = render(**leaves, **cam, near=NEAR, far=FAR, backend="cpu", **options)
    out.means2d.retain_grad()
    random_loss(out, dtype).backward()
    grads = {k: v.grad for k, v in leaves.items()}
    grads["means2d"] = out.means2d.grad
    return out, grads


def assert_swap_is_bitwise(run, swap):
    """run() -> (render, {name: gradient}) once as is and once after swap(),
    which returns the calls list: the emulated forward and backward must run,
    and every output and gradient must be bitwise the same (and non-zero)."""
    ref_out, ref_g = run()
    calls = swap()
    emu_out, emu_g = run()
    assert calls == ["fwd", "bwd"]  # the emulated kernels did run
    for k in ("rgb", "alpha", "depth", "normal", "distortion", "median_depth", "radii"):
        assert torch.equal(getattr(emu_out, k), getattr(ref_out, k)), k
    for k, g in ref_g.items():
        assert torch.equal(emu_g[k], g), f"d/d{k}"
        assert float(g.abs().max()) > 0, k


@pytest.mark.parametrize("deg", [None, 3], ids=["rgb", "sh3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_rasterize_with_emulated_projection_is_bitwise_the_cpu(emu, monkeypatch, dtype, deg):  # noqa: F811
    """splat.rasterize end to end: every output and every input gradient
    (means, quats, scales, opacities, colours or SH, means2d) bitwise equal
    with the projection's CUDA kernels in place of the CPU op."""
    s = scene(120, dtype, seed=7, width=64, height=48)

    colors = s["sh"][:, :16] if deg is not None else s["colors"]
    run = lambda: render_with_grads(splat.rasterize, s, colors, dtype, sh_degree=deg)  # noqa: E731
    assert_swap_is_bitwise(run, lambda: _swap_projection(monkeypatch, emu))


def test_rasterize_raises_the_torch_error_for_over_limit_surfels(emu, monkeypatch):  # noqa: F811 (fixture)
    s = scene(40, torch.float32, seed=2)
    s["scales"][17] = 1e9
    _swap_projection(monkeypatch, emu)
    kw = {k: s[k] for k in ("means", "quats", "scales", "opacities", "colors", "viewmat", "K", "width", "height")}
    with pytest.raises(ValueError, match=r"surfels at rows \[17\] project to screen coordinates of magnitude"):
        splat.rasterize(**kw, near=NEAR, far=FAR, backend="cpu")


def test_no_surfels(emu, cpu):  # noqa: F811 (fixture)
    s = scene(20, torch.float64)
    empty = {k: (v[:0] if torch.is_tensor(v) and k not in ("viewmat", "K") else v) for k, v in s.items()}
    args = forward_args(empty, 2)
    limits = R._magnitude_limits(torch.float64)
    assert_bitwise(emu.project_forward(*args, *limits), cpu.project_forward_cpu(*args, *limits), FORWARD_NAMES)
    ups = [t[:0] for t in upstream(20, torch.float64)]
    assert_bitwise(emu.project_backward(*args, *ups), cpu.project_backward_cpu(*args, *ups), BACKWARD_NAMES)


def test_bad_inputs_name_the_argument(emu):  # noqa: F811 (fixture)
    s = scene(20, torch.float64)
    args = list(forward_args(s, 2))
    limits = R._magnitude_limits(torch.float64)

    def fails(index, value, message):
        wrong = list(args)
        wrong[index] = value
        with pytest.raises(RuntimeError, match=message):
            emu.project_forward(*wrong, *limits)

    fails(1, s["quats"][:, :3].contiguous(), r"quats has shape \[20, 3\], expected \[20, 4\]")
    fails(2, s["scales"].float(), "scales has dtype Float, expected Double")
    fails(3, s["opacities"][:19], r"opacities has shape \[19\], expected 20 rows")
    fails(4, s["sh"][:, :8].contiguous(), "coeffs has too few SH coefficients for sh_degree 2")
    fails(6, s["viewmat"][:3].contiguous(), r"viewmat has shape \[3, 4\], expected \[4, 4\]")
    fails(7, s["K"].t(), "K must be contiguous")
    ups = list(upstream(20, torch.float64))
    ups[1] = ups[1][:10]
    with pytest.raises(RuntimeError, match=r"v_center has shape \[10, 2\], expected 20 rows"):
        emu.project_backward(*args, *ups)
