"""The CUDA kernels for 3D Gaussians, executed on the CPU under emulation,
against the CPU backend (issue 22).

The same harness as tests/test_cuda_emulation.py (the unchanged .cu files,
the real host call sequence, fibers with checked barriers and warp
collectives, poisoned shared memory, varied thread and block orders), on
the Gaussian instantiation of the tile kernels (cuda/gaussian_batch.cuh).
float64 batches hold 128 Gaussians where float32 ones hold 256 (shared
memory), so both sizes are crossed by the "deep" case.

Tolerances, as for surfels and for the same reason: forward BITWISE (the
same core.h maths in the same order, no FMA contraction on either side);
gradient records within 1e-12 (float64) / 2e-5 (float32) of each record
column's largest magnitude, the only difference being the order in which
each Gaussian's per-pixel records are summed (warp reduce-scatter and one
atomic per warp, against pixel order per tile on the CPU).
"""

from __future__ import annotations

import types

import pytest
import torch
from test_cuda_emulation import GRAD_TOL, check_parity as check_primitive_parity, cpu, emu, saved_state, upstream  # noqa: F401 (fixtures)

import splat
from splat.rasterize_3dgs import gaussian_kernel_inputs
from splat.testing import intrinsics, look_at_viewmat

RASTERIZE_3DGS = __import__("sys").modules["splat.rasterize_3dgs"]
NEAR, FAR = 0.2, 100.0
DTYPES = [torch.float64, torch.float32]
F64_BATCH, F32_BATCH = 128, 256  # gaussian_batch.cuh


def gaussian_scene(n, width, height, seed, dtype, opacity=None, spread=1.0, scale_range=(0.06, 0.3)):
    g = torch.Generator().manual_seed(seed)
    lo, hi = scale_range
    s = dict(
        means=(torch.rand(n, 3, generator=g, dtype=torch.float64) * 2 - 1) * torch.tensor([1.3, 1.0, 0.9]) * spread,
        quats=torch.randn(n, 4, generator=g, dtype=torch.float64),
        scales=torch.rand(n, 3, generator=g, dtype=torch.float64) * (hi - lo) + lo,
        opacities=torch.rand(n, generator=g, dtype=torch.float64) * 0.8 + 0.15,
        colors=torch.rand(n, 3, generator=g, dtype=torch.float64),
        background=torch.tensor([0.3, 0.6, 0.2], dtype=torch.float64),
        viewmat=look_at_viewmat((0.4, -0.3, -4.0), (0.0, 0.0, 0.0)),
        K=intrinsics(width, height, 60.0, (2.3, -1.4), 1.1),
    )
    if opacity is not None:
        s["opacities"] = torch.full_like(s["opacities"], opacity)
    return {k: v.to(dtype) for k, v in s.items()}


def kernel_args(s, width, height, antialiased=False, tight_seed=None):
    """(params, color, depth, pixel_rect) as rasterize_3dgs passes them, and
    the image arguments.  ``tight_seed``: a third of the rectangles replaced
    by random ones (shifted, empty, off-image or tighter than the footprint),
    which the kernels must honour exactly as the CPU does."""
    with torch.no_grad():
        kin = gaussian_kernel_inputs(
            s["means"],
            s["quats"],
            s["scales"],
            s["opacities"],
            s["viewmat"],
            s["K"],
            width,
            height,
            NEAR,
            FAR,
            antialiased,
        )
    rect = kin["pixel_rect"]
    if tight_seed is not None:
        g = torch.Generator().manual_seed(tight_seed)
        m = rect.shape[0]
        r = torch.randint(-20, width + 20, (m, 4), generator=g, dtype=torch.int32)
        pick = torch.randint(0, 3, (m,), generator=g) == 0
        rect = torch.where(pick[:, None], r, rect)
    args = [kin["params"].detach(), s["colors"][kin["ids"]], kin["depth"], rect]
    return [t.contiguous() for t in args], (width, height, NEAR, FAR)


def check_parity(cpu, emu, args, dims, label=""):  # noqa: F811 (cpu, emu are the fixtures' values)
    """Forward bitwise, gradient records within GRAD_TOL; returns the CPU forward."""
    ref_f, _ = check_primitive_parity(cpu, emu, args, dims, label, primitive="gaussians")
    return ref_f


CASES = {
    "plain": dict(n=60, W=64, H=48, seed=3),
    "antialiased": dict(n=60, W=64, H=48, seed=4, antialiased=True),
    # faint, large and crowded: tiles list more than 3 float32 batches (6 float64 ones)
    "deep": dict(n=1100, W=40, H=33, seed=5, opacity=0.012, spread=0.35, scale_range=(0.25, 0.6)),
    "opaque_early_exit": dict(n=500, W=50, H=37, seed=6, opacity=0.98, spread=0.5, scale_range=(0.2, 0.5)),
    "tight_offimage_rects": dict(n=200, W=61, H=29, seed=7, tight=True),
    "17x1": dict(n=40, W=17, H=1, seed=8, spread=0.3),
}


def case_args(name, dtype):
    kw = dict(CASES[name])
    W, H, antialiased, tight = kw.pop("W"), kw.pop("H"), kw.pop("antialiased", False), kw.pop("tight", False)
    s = gaussian_scene(kw.pop("n"), W, H, dtype=dtype, **kw)
    return kernel_args(s, W, H, antialiased, tight_seed=11 if tight else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(CASES))
def test_gaussians_match_cpu(emu, cpu, name, dtype):  # noqa: F811
    args, dims = case_args(name, dtype)
    ref_f = check_parity(cpu, emu, args, dims, name)
    counts, end = ref_f[9].diff(), ref_f[6]
    assert int(ref_f[10].numel()) > 0  # something was listed
    if name == "deep":
        assert int(counts.max()) > 3 * F32_BATCH and int(end.max()) > 3 * F32_BATCH  # blended past 3 batches
    if name == "opaque_early_exit":  # most pixels stop before their tile's list ends, past one batch
        H, W = end.shape
        tile = (torch.arange(H)[:, None] // 16) * ((W + 15) // 16) + torch.arange(W)[None, :] // 16
        assert int(counts.max()) > F32_BATCH
        assert float((end < counts[tile]).double().mean()) > 0.5
    if name == "tight_offimage_rects":
        assert bool((args[3][:, 0] < 0).any() or (args[3][:, 2] > dims[0]).any())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_no_pairs_and_no_gaussians(emu, cpu, dtype):  # noqa: F811
    args, dims = case_args("plain", dtype)
    args[3] = torch.zeros_like(args[3])  # every rectangle empty: P = 0
    assert check_parity(cpu, emu, args, dims, "P=0")[10].numel() == 0
    check_parity(cpu, emu, [t[:0].contiguous() for t in args], dims, "N=0")


def test_thread_and_block_orders_and_poison(emu, cpu):  # noqa: F811
    """Random thread and block orders with NaN/-1 poison (0xFF) in shared memory."""
    emu.configure("rand", "rand", 0xFF, 5)
    try:
        for name in ("deep", "opaque_early_exit"):
            for dtype in DTYPES:
                args, dims = case_args(name, dtype)
                check_parity(cpu, emu, args, dims, f"{name} rand-rand-0xFF")
    finally:
        emu.configure("fwd", "fwd", 0x7F, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_end_to_end_autograd(emu, dtype, monkeypatch):  # noqa: F811
    """splat.rasterize_3dgs with the emulated CUDA kernels standing in for the
    CPU ones: every output bitwise, every input's gradient (camera included)
    within GRAD_TOL of its largest magnitude."""
    W, H = 40, 30
    base = gaussian_scene(40, W, H, seed=9, dtype=torch.float64)
    names = ("means", "quats", "scales", "opacities", "colors", "background", "viewmat", "K")
    outputs = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")

    def run():
        p = {k: base[k].detach().to(dtype).requires_grad_(True) for k in names}
        out = splat.rasterize_3dgs(
            p["means"],
            p["quats"],
            p["scales"],
            p["opacities"],
            p["colors"],
            p["viewmat"],
            p["K"],
            W,
            H,
            background=p["background"],
            backend="cpu",
            antialiased=True,
        )
        g = torch.Generator().manual_seed(1)
        loss = sum(
            (
                getattr(out, k) * (torch.rand(getattr(out, k).shape, generator=g, dtype=torch.float64) - 0.3).to(dtype)
            ).sum()
            for k in outputs
        )
        grads = torch.autograd.grad(loss, [p[k] for k in names])
        return out, dict(zip(names, grads))

    ref_out, ref_g = run()
    real = RASTERIZE_3DGS.load_extension()
    calls = []
    fake = types.SimpleNamespace(
        forward_gaussians_cpu=lambda *a: (calls.append("fwd"), emu.forward_gaussians(*a))[1],
        backward_gaussians_cpu=lambda *a: (calls.append("bwd"), emu.backward_gaussians(*a))[1],
        gauss_params_size=real.gauss_params_size,
    )
    monkeypatch.setattr(RASTERIZE_3DGS, "load_extension", lambda: fake)
    emu_out, emu_g = run()
    assert calls == ["fwd", "bwd"]  # the emulated kernels did run
    for k in outputs:
        assert torch.equal(getattr(emu_out, k), getattr(ref_out, k)), k
    for k, g in ref_g.items():
        rel = float((emu_g[k] - g).abs().max()) / max(float(g.abs().max()), 1e-30)
        assert rel <= GRAD_TOL[dtype], f"d/d{k}: {rel:.3g}"


def test_bad_inputs_name_the_argument(emu):  # noqa: F811
    args, dims = case_args("plain", torch.float64)
    wrong = list(args)
    wrong[0] = args[0][:, :26].contiguous()
    with pytest.raises(RuntimeError, match=r"params has shape \[\d+, 26\], expected \[\d+, 27\]"):
        emu.forward_gaussians(*wrong, *dims)
    wrong = list(args)
    wrong[1] = args[1].float()
    with pytest.raises(RuntimeError, match="color has dtype Float, expected Double"):
        emu.forward_gaussians(*wrong, *dims)
    f = emu.forward_gaussians(*args, *dims)
    fewer = [t[:5].contiguous() for t in args]
    with pytest.raises(RuntimeError, match="saved forward state does not belong to these inputs"):
        emu.backward_gaussians(*fewer, *dims, *saved_state(f), *upstream(dims[0], dims[1], torch.float64))
