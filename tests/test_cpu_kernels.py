"""The CPU kernel modes against each other, and core.h's float32 exp.

The CPU backend has three modes (splat/kernels/cpu/rasterize_cpu.cpp):
0 = one pixel at a time over each surfel's whole pixel rectangle (the plain
loop), 1 = one pixel at a time over exact per-row spans of the footprint,
2 = 8 float32 pixels at a time: two 4-pixel windows over each surfel's
candidate pixels, those passing core.h's division-free footprint test with
the surfel's own rho cutoff (the default; float64 runs mode 1).  Every mode
performs exactly core.h's per-pixel operations in the same order, and the
spans and candidate tests only skip pixels the kernel rejects, so:
  * forward outputs are bitwise equal across modes (float32 and float64);
  * gradients are bitwise equal between modes 0 and 1;
  * mode 2 adds a surfel's eight lane contributions in another order: float32
    summation noise, measured <= 6e-7 of each tensor's largest magnitude on
    these scenes; we require 1e-5 (a wrong term is O(1)).
"""

import math
import platform
import re
import shutil
import subprocess
import sys

import pytest
import torch
from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves, render

from splat._backend import load_extension
from splat.testing import random_scene, surface_scene

ext = load_extension()


def _scenes():
    yield "random_offcentre", random_scene(60, 53, 37, seed=3, principal_offset=(5.5, -4.0), aspect=0.9)
    yield "dense_grazing", random_scene(150, 40, 40, seed=7, scale_range=(0.2, 0.6))
    yield "tiny_lowpass", random_scene(200, 48, 32, seed=5, scale_range=(0.0, 0.01))
    yield "surfaces", surface_scene(2500, 90, 70, dtype=torch.float64, seed=2)
    # surfels that cover the whole image, and a camera inside the cloud (near-plane crossings)
    yield "fullscreen", random_scene(30, 40, 24, seed=11, scale_range=(2.0, 6.0), depth=0.5)
    # opacities from just above kAlphaMin (1/255) to 0.05: each surfel's own rho
    # cutoff 2 ln(255 o) + 0.05 (the SIMD candidate test) is small, so many
    # pixels sit near it; overlapping, they still draw (alpha up to ~0.76)
    faint = random_scene(600, 40, 40, seed=13, scale_range=(0.2, 0.6))
    g = torch.Generator().manual_seed(13)
    faint["opacities"] = (1 / 255) * (1.0 + 12.0 * torch.rand(600, generator=g, dtype=torch.float64))
    yield "faint", faint


SCENES = dict(_scenes())


@pytest.fixture
def kernel_mode():
    before = ext.cpu_kernel_mode()
    yield ext.set_cpu_kernel_mode
    ext.set_cpu_kernel_mode(before)


def _run(scene, dtype, mode, set_mode):
    set_mode(mode)
    params = leaves(scene, dtype)
    weights = {k: w.to(dtype) for k, w in _weights(scene).items()}
    return all_grads(params, camera(scene, dtype), "cpu", weights)


_W = {}


def _weights(scene):
    if id(scene) not in _W:
        with torch.no_grad():
            _W[id(scene)] = cotangents(render(leaves(scene), camera(scene), "cpu"))
    return _W[id(scene)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(SCENES))
def test_modes_agree(name, dtype, kernel_mode):
    scene = SCENES[name]
    results = [_run(scene, dtype, mode, kernel_mode) for mode in (0, 1, 2)]
    out0, grads0 = results[0]
    assert float(out0.alpha.detach().max()) > 0.3, "scene draws nothing"
    for mode, (out, grads) in enumerate(results[1:], start=1):
        for k in OUTPUTS:
            assert torch.equal(getattr(out, k), getattr(out0, k)), f"mode {mode}: {k} differs"
        for k in grads0:
            if mode == 1 or dtype == torch.float64:
                assert torch.equal(grads[k], grads0[k]), f"mode {mode}: d/d{k} differs"
            else:
                scale = max(float(grads0[k].abs().max()), 1e-30)
                err = float((grads[k] - grads0[k]).abs().max()) / scale
                assert err <= 1e-5, f"mode {mode}: d/d{k} relative error {err:.2e}"


def test_simd_gradients_deterministic_across_threads(kernel_mode):
    kernel_mode(2)
    scene = SCENES["surfaces"]
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3, 1):
            torch.set_num_threads(n)
            results.append(_run(scene, torch.float32, 2, kernel_mode)[1])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for k in results[0]:
            assert torch.equal(results[0][k], other[k]), f"d/d{k} differs between thread counts"


def _forward_cpu_args(scene):
    """The arguments splat.rasterize passes to forward_cpu for this scene."""
    RASTERIZE = sys.modules["splat.rasterize"]  # the module (splat.rasterize is the function)
    seen = []
    real = RASTERIZE.load_extension()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def forward_cpu(self, *args):
            seen.append(args)
            return real.forward_cpu(*args)

    old = RASTERIZE.load_extension
    RASTERIZE.load_extension = lambda: Spy()
    try:
        render(leaves(scene, torch.float32), camera(scene, torch.float32), "cpu")
    finally:
        RASTERIZE.load_extension = old
    return seen[0]


def test_backward_reuses_the_forward_packed_records(kernel_mode):
    """forward_cpu returns the SIMD kernels' packed surfel records; backward_cpu
    given them computes the same bits as when it packs them again (an empty
    tensor), and a kernel mode without packed records ignores them."""
    kernel_mode(2)
    args = _forward_cpu_args(SCENES["surfaces"])
    f = ext.forward_cpu(*args)
    assert len(f) == 12 and f[11].dtype == torch.uint8 and f[11].numel() == 96 * args[0].shape[0]
    W, H = args[7], args[8]
    g = torch.Generator().manual_seed(1)
    up = [torch.rand(shape, generator=g) for shape in ((H, W, 3), (H, W), (H, W), (H, W, 3), (H, W), (H, W))]
    state = [f[9], f[10], f[6], f[7], f[1], f[8]]
    reused = ext.backward_cpu(*args, *state, *up, f[11])
    repacked = ext.backward_cpu(*args, *state, *up, torch.empty(0, dtype=torch.uint8))
    assert float(reused.abs().max()) > 0 and torch.equal(reused, repacked)
    kernel_mode(1)  # scalar kernels: no packed records, any given are ignored
    assert ext.forward_cpu(*args)[11].numel() == 0
    scalar = ext.backward_cpu(*args, *state, *up, f[11])
    assert torch.allclose(scalar, reused, rtol=1e-4, atol=1e-6 * float(reused.abs().max()))


def test_float32_exp_is_accurate_and_the_same_in_lanes():
    """core.h's float32 exp (Cephes' expf, written out so that CPU lanes and the
    GPU compute the same bits): within 2 ulp of the true exp on [-87, 88],
    exactly 0 below -87, and the 8-lane version bitwise equal to the scalar."""
    x = torch.cat(
        [
            torch.linspace(-87.0, 88.0, 400_000),
            torch.linspace(-12.0, 0.0, 100_000),
            torch.tensor([0.0, -0.0, -5.55, 1e-8, -1e-8, -87.0, 88.0, -90.0, -1e30]),
        ]
    )
    x = torch.cat([x, torch.zeros((-x.numel()) % 8)]).float().contiguous()
    scalar, lanes = ext.exp_float32(x)
    assert torch.equal(scalar, lanes)
    ok = x >= -87.0
    assert torch.equal(scalar[~ok], torch.zeros_like(scalar[~ok]))
    exact = torch.exp(x[ok].double())
    ulp = torch.tensor(float(torch.finfo(torch.float32).eps)).double() * exact.abs()
    # ulp of a float32 value v is eps * 2^floor(log2 v); eps * |v| over-estimates it by < 2x
    err = (scalar[ok].double() - exact).abs() / ulp
    assert float(err.max()) <= 2.0, float(err.max())
    assert float(scalar[x == 0][0]) == 1.0
    assert math.isclose(float(scalar[x == -5.55][0]), math.exp(-5.55), rel_tol=3e-7)


def test_reused_scratch_memory_gives_the_same_results(kernel_mode):
    """The kernels' large buffers (outputs, packed records, gradient records)
    come from a cache of freed blocks (cpu/scratch.h).  Rendering A, then B,
    then A again must give A's results bitwise: nothing left in a reused
    buffer by B may leak into A.  The images are large enough (256 x 240)
    for the outputs to be cached blocks (>= 1 MiB); the gradient records of
    the bigger scene too."""
    kernel_mode(2)
    a = surface_scene(40_000, 256, 240, dtype=torch.float64, seed=4)
    b = surface_scene(60_000, 256, 240, dtype=torch.float64, seed=5)
    ext.release_cpu_scratch()
    first = _run(a, torch.float32, 2, kernel_mode)
    _run(b, torch.float32, 2, kernel_mode)
    again = _run(a, torch.float32, 2, kernel_mode)
    for k in OUTPUTS:
        assert torch.equal(getattr(first[0], k), getattr(again[0], k)), k
    for k in first[1]:
        assert float(first[1][k].abs().max()) > 0 and torch.equal(first[1][k], again[1][k]), k
    del first, again
    assert ext.release_cpu_scratch() > 2**20  # blocks were cached, and are freed now
    assert ext.release_cpu_scratch() == 0


def test_backward_reads_broadcast_upstream_gradients_in_place(kernel_mode):
    """Upstream gradients broadcast to every pixel (stride 0, as autograd
    gives for a sum or mean; per channel for the 3-channel outputs) are read
    in place: the same bits as their contiguous copies.  Other strided
    gradients are refused with the argument's name (rasterize() makes them
    contiguous first)."""
    kernel_mode(2)
    args = _forward_cpu_args(SCENES["surfaces"])
    f = ext.forward_cpu(*args)
    W, H = args[7], args[8]
    state = [f[9], f[10], f[6], f[7], f[1], f[8]]
    g = torch.Generator().manual_seed(3)
    up = [
        torch.tensor([0.3, -0.2, 0.5]).expand(H, W, 3),
        torch.tensor(-0.7).expand(H, W),
        torch.rand(H, W, generator=g),
        torch.tensor(0.25).expand(H, W, 3),
        torch.tensor(1.5).expand(H, W),
        torch.zeros(()).expand(H, W),
    ]
    broadcast = ext.backward_cpu(*args, *state, *up, f[11])
    copied = ext.backward_cpu(*args, *state, *(u.contiguous() for u in up), f[11])
    assert float(broadcast.abs().max()) > 0 and torch.equal(broadcast, copied)
    strided = torch.rand(W, H, generator=g).t()  # neither contiguous nor broadcast
    with pytest.raises(RuntimeError, match="v_depth_sum must be contiguous or broadcast"):
        ext.backward_cpu(*args, *state, up[0], up[1], strided, *up[3:], f[11])


def test_sum_and_mean_losses_match_their_dense_form(kernel_mode):
    """Through rasterize(): a loss of sums and means (broadcast upstream
    gradients, read in place) gives the bits of the same loss written with
    dense weight images (contiguous gradients)."""
    kernel_mode(2)
    scene = SCENES["surfaces"]

    def grads(dense):
        params = leaves(scene, torch.float32)
        out = render(params, camera(scene, torch.float32), "cpu")
        H, W = out.depth.shape
        if dense:
            loss = (
                (out.rgb * torch.full((H, W, 3), 1.0)).sum()
                + (out.depth * torch.full((H, W), 0.5)).sum()
                + (out.distortion * torch.full((H, W), 1.0 / (H * W))).sum()
            )
        else:
            loss = out.rgb.sum() + 0.5 * out.depth.sum() + out.distortion.mean()
        loss.backward()
        return {k: v.grad for k, v in params.items()}

    broadcast, dense = grads(False), grads(True)
    for k in dense:
        assert float(dense[k].abs().max()) > 0 and torch.equal(broadcast[k], dense[k]), k


def fused_multiply_adds(library):
    """The fused multiply-add instructions (x86 FMA3: vfmadd, vfmsub, vfnmadd,
    vfnmsub, vfmaddsub, vfmsubadd) in a shared library's disassembly."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return [line.strip() for line in text.splitlines() if re.search(r"\svfn?m(add|sub)", line)]


@pytest.mark.skipif(
    shutil.which("objdump") is None or platform.machine() not in ("x86_64", "AMD64"),
    reason="needs objdump and an x86-64 build",
)
def test_build_has_no_fused_multiply_add():
    """The CPU kernels round like the CUDA build (nvcc --fmad=false) and the
    emulation tests only without FMA contraction: -ffp-contract=off
    (splat/_compile_flags.py).  GCC 12's vectoriser still fused lane pairs
    into vfmaddsub in an AVX-512 clone of the projection, so the built
    extension itself is checked: bitwise tests compare forward outputs, but a
    contraction in a backward pass would hide inside gradient tolerances."""
    library = load_extension().__file__
    found = fused_multiply_adds(library)
    assert not found, f"{len(found)} fused multiply-adds in {library}, e.g. {found[:3]}"


def _gaussian_scenes():
    from splat.testing import random_gaussians

    base = random_scene(1, 53, 37, seed=3, principal_offset=(5.5, -4.0))
    yield "random_offcentre", {**base, **random_gaussians(300, seed=3)}
    # opacities just above kAlphaMin: many pixels near each Gaussian's own rho
    # cutoff 2 ln(255 o) + 0.05, the SIMD candidate test's margin
    faint = {**base, **random_gaussians(500, seed=13, scale_range=(0.2, 0.6))}
    g = torch.Generator().manual_seed(13)
    faint["opacities"] = (1 / 255) * (1.0 + 12.0 * torch.rand(500, generator=g, dtype=torch.float64))
    yield "faint", faint
    # flat Gaussians on surfaces, trained-model-like sizes, some behind the near plane
    s = surface_scene(2500, 90, 70, dtype=torch.float64, seed=2)
    s["scales"] = torch.cat([s["scales"], 0.3 * s["scales"].amin(-1, keepdim=True)], -1)
    yield "surfaces", s


GAUSSIAN_SCENES = dict(_gaussian_scenes())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(GAUSSIAN_SCENES))
def test_gaussian_modes_agree_bitwise(name, dtype, kernel_mode):
    """3D Gaussians in the three modes (one tile loop, cpu/tile_loop.h): the
    SIMD backward adds its lanes' gradients in the scalar loop's pixel order,
    so outputs and gradients are bitwise equal, float32 included."""
    from splat.rasterize_3dgs import rasterize_3dgs

    scene = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in GAUSSIAN_SCENES[name].items()}
    keys = ("means", "quats", "scales", "opacities", "colors")
    results = []
    for mode in (0, 1, 2):
        kernel_mode(mode)
        params = {k: scene[k].clone().requires_grad_(True) for k in keys}
        out = rasterize_3dgs(**{**scene, **params}, backend="cpu")
        g = torch.Generator().manual_seed(0)
        loss = sum(
            (getattr(out, k) * torch.rand(getattr(out, k).shape, generator=g, dtype=dtype)).sum() for k in OUTPUTS
        )
        loss.backward()
        results.append(({k: getattr(out, k).detach() for k in OUTPUTS}, {k: params[k].grad for k in keys}))
    outs0, grads0 = results[0]
    assert float(outs0["alpha"].max()) > 0.3, "scene draws nothing"
    for mode, (outs, grads) in enumerate(results[1:], start=1):
        for k in OUTPUTS:
            assert torch.equal(outs[k], outs0[k]), f"mode {mode}: {k} differs"
        for k in keys:
            assert torch.isfinite(grads0[k]).all(), k
            assert torch.equal(grads[k], grads0[k]), f"mode {mode}: d/d{k} differs"
