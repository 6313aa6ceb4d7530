"""The CUDA kernels, executed on the CPU under emulation, against the CPU backend.

The UNCHANGED ``splat/kernels/cuda/*.cu`` are compiled with the host
C++ compiler against the cudaemu shim (tests/cuda_emulation/, built just in
time and cached like splat's JIT extension) and driven by the very host call
sequence of the CUDA bindings (cuda/host_sequence.h).  Each block's threads
are fibers with checked barriers and warp collectives, shared memory is
poisoned per block, and thread and block orders vary, so a missing barrier, a
wrong warp mask, an uninitialised shared value or an off-by-one in the last
batch shows up as a mismatch or an error naming the .cu line.

Tolerances:
* forward (every output, the binning and the saved state): BITWISE equal.
  Both backends run core.h's maths in the same order with the same libm and
  no FMA contraction (-ffp-contract=off on both sides).
* gradients (the per-surfel records): the backward kernel sums each surfel's
  per-pixel records in a different order (warp reduce-scatter, then one atomic
  per warp in block order) than the CPU (pixel order per tile, tiles in order),
  which is the only difference; the error is a few ulps of the summands'
  magnitude per pixel touched.  We allow 1e-12 (float64) and 2e-5 (float32)
  relative to the largest magnitude of each record column: ~10x the largest
  measured difference (see test output with -s); a real bug (a dropped or
  doubled pixel) changes a column by far more.
"""

from __future__ import annotations

import types

import pytest
import torch
from cuda_emulation.build import build
from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves, render
from test_finite_differences import SCENES as FD_SCENES

import splat
from splat._backend import load_extension
from splat.testing import random_scene, surface_scene

RASTERIZE = __import__("sys").modules["splat.rasterize"]  # the module (splat.rasterize is the function)
FORWARD_NAMES = (
    "color_sum",
    "transmittance",
    "depth_sum",
    "normal_sum",
    "distortion",
    "median_depth",
    "end",
    "median_index",
    "totals",
    "tile_offsets",
    "point_list",
)
GRAD_TOL = {torch.float64: 1e-12, torch.float32: 2e-5}
NEAR, FAR = 0.2, 100.0


@pytest.fixture(scope="module")
def emu():
    module = build()
    module.configure("fwd", "fwd", 0x7F, 0)
    yield module
    module.configure("fwd", "fwd", 0x7F, 0)


@pytest.fixture(scope="module")
def cpu():
    return load_extension()


def kernel_inputs(scene, dtype):
    """The exact arguments splat.rasterize passes to the kernels for `scene`,
    recorded at the call (so this follows any change to the projection)."""
    real = load_extension()
    seen = []

    def forward_cpu(*args):
        seen.append(args)
        return real.forward_cpu(*args)

    s = {k: (v.to(dtype) if torch.is_tensor(v) else v) for k, v in scene.items()}
    old = RASTERIZE.load_extension
    RASTERIZE.load_extension = lambda: types.SimpleNamespace(forward_cpu=forward_cpu)
    try:
        with torch.no_grad():
            splat.rasterize(
                s["means"],
                s["quats"],
                s["scales"],
                s["opacities"],
                s["colors"],
                s["viewmat"],
                s["K"],
                s["width"],
                s["height"],
                near=NEAR,
                far=FAR,
                backend="cpu",
            )
    finally:
        RASTERIZE.load_extension = old
    assert len(seen) == 1
    args = [t.detach().clone() for t in seen[0][:7]]
    return args, tuple(seen[0][7:])


def upstream(W, H, dtype, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.rand(shape, generator=g, dtype=torch.float64).to(dtype) - 0.3
        for shape in ((H, W, 3), (H, W), (H, W), (H, W, 3), (H, W), (H, W))
    ]


def saved_state(f):
    return [f[9], f[10], f[6], f[7], f[1], f[8]]  # tile_offsets, point_list, end, median_index, T, totals


def check_parity(cpu, emu, args, dims, label="", primitive="surfels"):
    """Forward bitwise, gradients within GRAD_TOL; returns (forward, largest
    relative gradient difference).  ``primitive``: "surfels" (forward_cpu and
    the harness's forward) or "gaussians" (forward_gaussians_cpu and
    forward_gaussians), with their backwards."""
    suffix = "" if primitive == "surfels" else "_gaussians"
    cpu_forward, cpu_backward = getattr(cpu, f"forward{suffix}_cpu"), getattr(cpu, f"backward{suffix}_cpu")
    emu_forward, emu_backward = getattr(emu, f"forward{suffix}"), getattr(emu, f"backward{suffix}")
    dtype = args[0].dtype
    W, H = dims[0], dims[1]
    ref_f = cpu_forward(*args, *dims)
    emu_f = emu_forward(*args, *dims)
    for name, a, b in zip(FORWARD_NAMES, emu_f, ref_f):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{label} {name}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs()
            raise AssertionError(
                f"{label} {name}: not bitwise equal, {int((diff > 0).sum())} entries differ, "
                f"max |diff| {float(diff.max()):.3g}"
            )
    up = upstream(W, H, dtype)
    # The CPU surfel forward's packed records (anything after the 11 outputs) go back to its backward.
    ref_b = cpu_backward(*args, *dims, *saved_state(ref_f), *up, *ref_f[11:])
    emu_b = emu_backward(*args, *dims, *saved_state(emu_f), *up)
    assert emu_b.shape == ref_b.shape
    rel = 0.0
    if ref_b.numel():
        scale = ref_b.abs().amax(0).clamp_min(torch.finfo(dtype).tiny)
        rel = float(((emu_b - ref_b).abs() / scale).max())
    assert rel <= GRAD_TOL[dtype], f"{label}: gradient records differ by {rel:.3g} (relative), tol {GRAD_TOL[dtype]:g}"
    return ref_f, rel


# ---- scenes -----------------------------------------------------------------------------
def raw_case(n, W, H, seed, dtype, opaque=False, tight=False, weird_depth=False, faint=False):
    """Kernel inputs from a random scene, optionally edited below the projection:
    depths (the sort key) negative, -0.0, tied or huge; rectangles shifted,
    empty, off-image or tighter than the footprint; near-opaque surfels (early
    exit); faint surfels (pixels blend past several batches)."""
    scene = random_scene(n, W, H, seed=seed, scale_range=(0.2, 0.9) if opaque else (0.05, 0.35))
    if opaque:
        scene["opacities"] = torch.full_like(scene["opacities"], 0.98)
    if faint:
        scene["opacities"] = torch.full_like(scene["opacities"], 0.012)
    args, dims = kernel_inputs(scene, dtype)
    g = torch.Generator().manual_seed(seed)
    if weird_depth:
        depth = args[5]
        pick = torch.randint(0, 6, depth.shape, generator=g)
        depth = torch.where(pick == 0, torch.zeros_like(depth), depth)
        depth = torch.where(pick == 1, -torch.zeros_like(depth), depth)
        depth = torch.where(pick == 2, -depth, depth)
        depth = torch.where(pick == 3, torch.full_like(depth, 3.0), depth)
        depth = torch.where(pick == 4, depth * 1e30, depth)
        args[5] = depth.contiguous()
    if tight:
        r = torch.randint(-20, W + 20, (n, 4), generator=g, dtype=torch.int32)
        mode = torch.randint(0, 3, (n,), generator=g)
        args[6] = torch.where((mode == 0)[:, None], r, args[6]).contiguous()
    return args, dims


DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(FD_SCENES) + ["random60", "surfaces"])
def test_scenes_match_cpu(emu, cpu, name, dtype):
    if name == "random60":
        scene = random_scene(60, 70, 45, seed=0, principal_offset=(7.0, -3.0))
    elif name == "surfaces":
        scene = surface_scene(3000, 96, 72, dtype=torch.float64, seed=1)
    else:
        scene = FD_SCENES[name]
    args, dims = kernel_inputs(scene, dtype)
    ref_f, rel = check_parity(cpu, emu, args, dims, name)
    assert int(ref_f[10].numel()) > 0  # something was drawn


EDGE_CASES = {
    # > 3 shared-memory batches (of 256) in some tiles
    "deep": dict(n=2500, W=40, H=33, seed=1, faint=True),
    "opaque_early_exit": dict(n=700, W=50, H=37, seed=2, opaque=True),
    "tight_offimage_rects": dict(n=300, W=61, H=29, seed=4, tight=True),
    "neg_zero_tied_depths": dict(n=400, W=45, H=45, seed=5, weird_depth=True),
    "1x1": dict(n=50, W=1, H=1, seed=6),
    "17x1": dict(n=50, W=17, H=1, seed=7),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_cases_match_cpu(emu, cpu, case, dtype):
    kw = EDGE_CASES[case]
    args, dims = raw_case(
        kw["n"],
        kw["W"],
        kw["H"],
        kw["seed"],
        dtype,
        kw.get("opaque", False),
        kw.get("tight", False),
        kw.get("weird_depth", False),
        kw.get("faint", False),
    )
    ref_f, _ = check_parity(cpu, emu, args, dims, case)
    counts = ref_f[9].diff()
    end = ref_f[6]
    if case == "deep":
        assert int(counts.max()) > 3 * 256 and int(end.max()) > 3 * 256  # blended past 3 batches
    if case == "opaque_early_exit":
        assert int(counts.max()) > 256 and int(end.max()) < int(counts.max())  # stopped early
    if case == "neg_zero_tied_depths":
        d = args[5]
        assert bool((d < 0).any()) and bool((d == 0).any()) and bool(torch.signbit(d[d == 0]).any())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_no_pairs_and_no_surfels(emu, cpu, dtype):
    args, dims = raw_case(30, 20, 20, 8, dtype)
    args[6] = torch.zeros_like(args[6])  # every rectangle empty: P = 0
    ref_f, _ = check_parity(cpu, emu, args, dims, "P=0")
    assert ref_f[10].numel() == 0
    none = [t[:0].contiguous() for t in args]  # N = 0
    check_parity(cpu, emu, none, dims, "N=0")


SCHEDULES = [("rev", "rev", 0xFF, 1), ("rand", "rand", 0x7F, 2), ("rand", "fwd", 0xFF, 3)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["rev-rev-0xFF", "rand-rand-0x7F", "rand-fwd-0xFF"])
def test_thread_and_block_orders_and_poison(emu, cpu, schedule):
    """The kernels may not depend on the order threads or blocks run in, nor on
    what shared memory holds before they write it (0x7F: large finite values
    and ints; 0xFF: NaN and -1)."""
    thread_order, block_order, poison, seed = schedule
    emu.configure(thread_order, block_order, poison, seed)
    try:
        for case in ("deep", "opaque_early_exit", "17x1"):
            kw = EDGE_CASES[case]
            for dtype in DTYPES:
                args, dims = raw_case(
                    kw["n"], kw["W"], kw["H"], kw["seed"], dtype, kw.get("opaque", False), faint=kw.get("faint", False)
                )
                check_parity(cpu, emu, args, dims, f"{case} {schedule}")
    finally:
        emu.configure("fwd", "fwd", 0x7F, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_end_to_end_autograd(emu, dtype, monkeypatch):
    """splat.rasterize with the emulated CUDA kernels standing in for the CPU
    ones: every output and every input gradient.  Outputs bitwise; gradients
    1e-12 / 2e-5 of each tensor's largest magnitude (summation order only)."""
    scene = random_scene(60, 70, 45, seed=0, principal_offset=(7.0, -3.0))
    base = leaves(scene)
    base["background"] = torch.tensor([0.3, 0.1, 0.8], dtype=torch.float64)
    with torch.no_grad():
        w = {k: v.to(dtype) for k, v in cotangents(render(base, camera(scene), "cpu")).items()}

    def params():
        return {k: v.detach().to(dtype).requires_grad_(True) for k, v in base.items()}

    ref_out, ref_g = all_grads(params(), camera(scene, dtype), "cpu", w)
    calls = []
    fake = types.SimpleNamespace(
        forward_cpu=lambda *a: (calls.append("fwd"), emu.forward(*a))[1],
        backward_cpu=lambda *a: (calls.append("bwd"), emu.backward(*a))[1],
    )
    monkeypatch.setattr(RASTERIZE, "load_extension", lambda: fake)
    emu_out, emu_g = all_grads(params(), camera(scene, dtype), "cpu", w)
    assert calls == ["fwd", "bwd"]  # the emulated kernels did run
    for k in OUTPUTS:
        assert torch.equal(getattr(emu_out, k), getattr(ref_out, k)), k
    for k, g in ref_g.items():
        rel = float((emu_g[k] - g).abs().max()) / max(float(g.abs().max()), 1e-30)
        assert rel <= GRAD_TOL[dtype], f"d/d{k}: {rel:.3g}"


# ---- the harness itself --------------------------------------------------------------
@pytest.mark.parametrize(
    "bug, message",
    [
        ("divergent_barrier", r"divergent barrier .* at selftest\.cu:35 and at __syncthreads at selftest\.cu:37"),
        ("deadlock", r"deadlock .* __shfl_sync at selftest\.cu:43; 16 thread\(s\) at __syncthreads at selftest\.cu:45"),
        ("exited_lane", r"selftest\.cu:51 .* lane 5 of the mask 0xffffffff has already exited"),
        ("partial_warp", r"selftest\.cu:55 .* names lane 16, which does not exist"),
        ("lane_not_in_mask", r"selftest\.cu:59 .* calling lane 16 is not in the mask 0x0000ffff"),
        ("vote_in_branch", r"deadlock .* __any_sync at selftest\.cu:63"),
        ("too_much_shared", r"57344 bytes at selftest\.cu:68, over the 48 KiB limit"),
        ("block_too_large", r"invalid launch configuration .* block \(2048, 1, 1\)"),
        ("grid_y_too_large", r"invalid launch configuration .* grid \(1, 65536, 1\)"),
    ],
)
def test_harness_reports_synchronisation_bugs_with_their_line(emu, bug, message):
    import re

    text = emu.selftest(bug)
    assert re.search(message, text), text


def test_harness_runs_correct_kernels_and_poisons_shared_memory(emu):
    assert emu.selftest("good") == "ok"  # barriers, warp shuffles, __syncthreads_count, __ballot_sync
    assert emu.selftest("uninitialised_shared") == "ok"  # an unwritten shared int reads the poison
    emu.configure("fwd", "fwd", 0, 0)
    try:
        assert emu.selftest("uninitialised_shared") != "ok"  # ...which the test can see change
    finally:
        emu.configure("fwd", "fwd", 0x7F, 0)


def test_backward_rejects_state_of_another_forward(emu, cpu):
    a, dims = raw_case(40, 30, 20, 1, torch.float64)
    b, _ = raw_case(10, 30, 20, 2, torch.float64)
    fa = emu.forward(*a, *dims)
    with pytest.raises(RuntimeError, match="saved forward state does not belong to these inputs"):
        emu.backward(*b, *dims, *saved_state(fa), *upstream(dims[0], dims[1], torch.float64))
    wrong = list(saved_state(fa))
    wrong[0] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="tile_offsets has shape"):
        emu.backward(*a, *dims, *wrong, *upstream(dims[0], dims[1], torch.float64))
