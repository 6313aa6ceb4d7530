"""CUDA backend against the CPU backend (skipped without a GPU and CUDA kernels).

Both sides run the same core.h with the same float32 exp (core.h's portable
exp_float), no FMA contraction (nvcc --fmad=false, g++ -ffp-contract=off) and
IEEE division and sqrt, and the CUDA kernels are executed against the CPU
backend in every CI run under emulation (tests/test_cuda_emulation.py, bitwise
forward).  What only a GPU shows: the float64 exp (and the projection's
log) is the device library's, not glibc's, and where viewmat or K need a
gradient the projection runs as torch ops whose CUDA reductions (matmul,
sums) round differently from the CPU's (without one, both backends run the
fused projection, kernels/project_surfels.h, bitwise alike on its own).  An input that moves by an ulp can
flip a pixel's threshold decision -- alpha >= 1/255, the transmittance floor,
the median's T > 0.5 -- and that pixel's values then differ by O(1/255), not
by rounding.  So:

* values: every pixel within the tolerance, except at most FLIP_PIXELS pixels
  per output (a flip is local to its pixel);
* gradients: every surfel's gradient within the tolerance, except at most
  FLIP_SURFELS surfels (a flipped pixel changes the gradients of the surfels
  blended there, a handful);
* tolerances relative to each tensor's largest magnitude: float64 1e-9
  (rounding of reordered sums only: the atomics and torch's reductions);
  float32 1e-5 on values, 1e-3 on gradients (the atomics' order, amplified
  by the transmittance products of deep pixels).
Everything else -- radii, the count of outliers -- is strict.
"""

import pytest
import torch
from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves, render

from splat._backend import has_cuda_kernels
from splat.testing import random_scene, surface_scene

needs_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and has_cuda_kernels()), reason="needs a GPU and splat built with CUDA kernels"
)

TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-5, 1e-3)}
FLIP_PIXELS = 3
FLIP_SURFELS = 3


def assert_close_but_flips(actual, expected, rel_tol, max_outliers, what):
    """|actual - expected| <= rel_tol * max|expected| everywhere except at most
    `max_outliers` rows of the leading dimension (pixels flattened for images)."""
    a = actual.detach().cpu().double()
    b = expected.detach().cpu().double()
    assert a.shape == b.shape, what
    if b.dim() >= 3:  # [H, W, C] images: one row per pixel
        a, b = a.reshape(-1, b.shape[-1]), b.reshape(-1, b.shape[-1])
    err = (a - b).abs().reshape(b.shape[0], -1).amax(dim=1) if b.dim() else (a - b).abs().reshape(1)
    bad = int((err > rel_tol * max(float(b.abs().max()), 1e-12)).sum())
    assert bad <= max_outliers, f"{what}: {bad} rows outside {rel_tol:g} (at most {max_outliers} allowed)"


def test_flip_allowance_counts_rows():
    """The comparison itself: outliers are counted per pixel / surfel and capped."""
    b = torch.ones(4, 5, 3)
    a = b.clone()
    a[0, 0] += 0.5  # one pixel, all channels: one outlier
    a[1, 1, 2] += 0.5
    assert_close_but_flips(a, b, 1e-6, 2, "two pixels")
    a[2, 2, 0] -= 0.5
    with pytest.raises(AssertionError, match="3 rows"):
        assert_close_but_flips(a, b, 1e-6, 2, "three pixels")
    g = torch.zeros(10, 3)
    g[0, 0] = 1.0
    assert_close_but_flips(g + 1e-12, g, 1e-9, 0, "rounding only")


def _to(params, device, dtype):
    return {k: v.detach().to(device=device, dtype=dtype).requires_grad_(True) for k, v in params.items()}


def _cam(scene, device, dtype):
    c = camera(scene, dtype)
    return dict(c, viewmat=c["viewmat"].to(device), K=c["K"].to(device))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "scene",
    [
        random_scene(60, 70, 45, seed=0, principal_offset=(7.0, -3.0)),
        surface_scene(5000, 160, 120, dtype=torch.float64, seed=1),
    ],
    ids=["random", "surfaces"],
)
def test_cuda_matches_cpu(scene, dtype):
    base = leaves(scene)
    base["background"] = torch.tensor([0.3, 0.1, 0.8], dtype=torch.float64)
    with torch.no_grad():
        weights = cotangents(render(base, camera(scene), "cpu"))
    w = {k: v.to(dtype) for k, v in weights.items()}
    cpu_out, cpu_grads = all_grads(_to(base, "cpu", dtype), _cam(scene, "cpu", dtype), "cpu", w)
    gpu_out, gpu_grads = all_grads(
        _to(base, "cuda", dtype), _cam(scene, "cuda", dtype), "cuda", {k: v.cuda() for k, v in w.items()}
    )
    value_tol, grad_tol = TOL[dtype]
    for k in OUTPUTS:
        assert_close_but_flips(getattr(gpu_out, k), getattr(cpu_out, k), value_tol, FLIP_PIXELS, k)
    assert torch.equal(gpu_out.radii.cpu(), cpu_out.radii)
    for k in cpu_grads:
        assert_close_but_flips(gpu_grads[k], cpu_grads[k], grad_tol, FLIP_SURFELS, f"d/d{k}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "antialiased"])
def test_cuda_matches_cpu_for_3d_gaussians(dtype, antialiased):
    """splat.rasterize_3dgs on the GPU against the CPU kernels: every output
    and every input's gradient, with the tolerances and flip allowance above
    (the same reasons: torch's CUDA reductions in the projection and the
    device's float64 exp)."""
    from test_cuda_emulation_3dgs import gaussian_scene

    import splat

    W, H = 64, 48
    base = gaussian_scene(300, W, H, seed=2, dtype=torch.float64)
    names = ("means", "quats", "scales", "opacities", "colors", "background", "viewmat", "K")
    outputs = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")

    def run(device):
        p = {k: base[k].detach().to(device=device, dtype=dtype).requires_grad_(True) for k in names}
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
            antialiased=antialiased,
        )
        g = torch.Generator().manual_seed(1)
        loss = sum(
            (
                getattr(out, k)
                * (torch.rand(getattr(out, k).shape, generator=g, dtype=torch.float64) - 0.3).to(
                    device=device, dtype=dtype
                )
            ).sum()
            for k in outputs
        )
        return out, dict(zip(names, torch.autograd.grad(loss, [p[k] for k in names])))

    cpu_out, cpu_grads = run("cpu")
    gpu_out, gpu_grads = run("cuda")
    value_tol, grad_tol = TOL[dtype]
    for k in outputs:
        assert_close_but_flips(getattr(gpu_out, k), getattr(cpu_out, k), value_tol, FLIP_PIXELS, k)
    assert torch.equal(gpu_out.radii.cpu(), cpu_out.radii)
    for k in cpu_grads:
        assert_close_but_flips(gpu_grads[k], cpu_grads[k], grad_tol, FLIP_SURFELS, f"d/d{k}")


@needs_gpu
@pytest.mark.parametrize("deg", [None, 0, 3], ids=lambda d: f"sh{d}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_projection_kernels_match_cpu(dtype, deg):
    """The fused projection's CUDA kernels (cuda/project.cu) against the CPU
    op, forward and backward, BITWISE: both run kernels/project_surfels.h with
    IEEE +, -, *, /, sqrt and no FMA (--fmad=false), per surfel, no sums
    across surfels.  The one library function, the float64 log of the
    opacity cutoff, feeds only the integer pixel rectangles and radii, which
    must be equal too (a flip needs a bound within an ulp of an integer)."""
    import importlib

    from test_cuda_emulation_project import BACKWARD_NAMES, FORWARD_NAMES, forward_args, scene, upstream

    from splat._backend import load_extension

    limits = importlib.import_module("splat.rasterize")._magnitude_limits(dtype)
    ext = load_extension()
    s = scene(3001, dtype)
    args = forward_args(s, deg)
    gpu_args = [t.cuda() if torch.is_tensor(t) else t for t in args]
    ups = upstream(3001, dtype)
    pairs = [
        (FORWARD_NAMES, ext.project_forward_cpu(*args, *limits), ext.project_forward_cuda(*gpu_args, *limits)),
        (
            BACKWARD_NAMES,
            ext.project_backward_cpu(*args, *ups),
            ext.project_backward_cuda(*gpu_args, *(u.cuda() for u in ups)),
        ),
    ]
    for names, cpu, gpu in pairs:
        _assert_bitwise_on_gpu(names, cpu, gpu)


def _assert_bitwise_on_gpu(names, cpu, gpu):
    """Each of `gpu` on the GPU, and bitwise the corresponding `cpu` tensor."""
    for name, a, b in zip(names, cpu, gpu):
        assert b.is_cuda and a.shape == b.shape and a.dtype == b.dtype, name
        b = b.cpu()
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        assert torch.equal(a, b), f"{name}: largest difference {diff:.3g}"


@needs_gpu
@pytest.mark.parametrize("camera_grad", [False, True], ids=["fused", "torch-projection"])
def test_rasterize_on_cuda_takes_the_fused_projection_unless_the_camera_needs_gradients(camera_grad, monkeypatch):
    """splat.rasterize(backend="auto") on CUDA tensors runs project_forward_cuda
    exactly when viewmat and K need no gradient (as the CPU backend), and
    either way matches the CPU backend (SH colours of degree 3)."""
    from splat import rasterize

    scene = surface_scene(4000, 96, 64, dtype=torch.float64, seed=3)
    leaves = {k: scene[k] for k in ("means", "quats", "scales", "opacities")}
    n = scene["means"].shape[0]
    leaves["colors"] = 0.3 * torch.randn(n, 16, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _check_fused_projection_choice(
        monkeypatch,
        "project_forward_cuda",
        camera_grad,
        scene,
        leaves,
        lambda *a: rasterize(*a, scene["width"], scene["height"], sh_degree=3),
    )


def _check_fused_projection_choice(monkeypatch, op_name, camera_grad, scene, leaves, render, fused=None):
    """render(*leaves, viewmat, K) on the CPU and on CUDA, the camera with a
    gradient or not: the CUDA op `op_name` (the fused projection) must run
    once if `fused` (default: exactly when the camera has no gradient), and
    the GPU's render and gradients must match the CPU's up to flips."""
    from splat._backend import load_extension

    ext = load_extension()
    calls = []
    original = getattr(ext, op_name)
    monkeypatch.setattr(ext, op_name, lambda *a: (calls.append(1), original(*a))[1], raising=False)
    names = tuple(leaves)

    def run(device):
        p = {k: leaves[k].detach().to(device).requires_grad_(True) for k in names}
        cam = [scene[k].detach().to(device).requires_grad_(camera_grad) for k in ("viewmat", "K")]
        out = render(*(p[k] for k in names), *cam)
        loss = (out.rgb * torch.linspace(-1, 1, 3, dtype=torch.float64, device=device)).sum() + out.depth.sum()
        return out, dict(zip(names, torch.autograd.grad(loss, [p[k] for k in names])))

    cpu_out, cpu_grads = run("cpu")
    gpu_out, gpu_grads = run("cuda")
    assert len(calls) == (int(not camera_grad) if fused is None else int(fused))
    for k in ("rgb", "alpha", "depth", "normal"):
        assert_close_but_flips(getattr(gpu_out, k), getattr(cpu_out, k), 1e-9, FLIP_PIXELS, k)
    assert torch.equal(gpu_out.radii.cpu(), cpu_out.radii)
    for k in names:
        assert_close_but_flips(gpu_grads[k], cpu_grads[k], 1e-9, FLIP_SURFELS, f"d/d{k}")


@needs_gpu
@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "antialiased"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_gaussian_projection_kernels_match_cpu(dtype, antialiased):
    """The fused projection of 3D Gaussians on CUDA (cuda/project.cu) against
    the CPU op, forward (the cull's ids included) and backward, BITWISE: both
    run kernels/project_gaussians.h with IEEE +, -, *, /, sqrt and no FMA,
    per Gaussian, and the camera's gradient summed in float64 over the same
    blocks in the same order.  The one library function, the
    float64 log of the opacity cutoff, feeds only the integer pixel
    rectangles and radii, which must be equal too."""
    from test_cuda_emulation_project_3dgs import (
        BACKWARD_NAMES,
        CAMERA_NAMES,
        FORWARD_NAMES,
        backward_args,
        forward_args,
        scene,
        upstream,
    )

    from splat._backend import load_extension

    ext = load_extension()
    s = scene(3001, dtype)
    gpu = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in s.items()}
    cpu_fwd = ext.project_gaussians_forward_cpu(*forward_args(s, antialiased))
    gpu_fwd = ext.project_gaussians_forward_cuda(*forward_args(gpu, antialiased))
    ids = cpu_fwd[0]
    v_params, v_centre = upstream(ids.shape[0], dtype)
    cpu_bwd = ext.project_gaussians_backward_cpu(*backward_args(s, ids, antialiased, v_params, v_centre, True))
    gpu_bwd = ext.project_gaussians_backward_cuda(
        *backward_args(gpu, gpu_fwd[0], antialiased, v_params.cuda(), v_centre.cuda(), True)
    )
    _assert_bitwise_on_gpu(FORWARD_NAMES, cpu_fwd, gpu_fwd)
    _assert_bitwise_on_gpu(BACKWARD_NAMES + CAMERA_NAMES, cpu_bwd, gpu_bwd)


@needs_gpu
@pytest.mark.parametrize("camera_grad", [False, True], ids=["", "camera-grad"])
def test_rasterize_3dgs_on_cuda_takes_the_fused_projection(camera_grad, monkeypatch):
    """splat.rasterize_3dgs(backend="auto") on CUDA tensors runs
    project_gaussians_forward_cuda whether or not viewmat and K need a
    gradient (as on the CPU), and matches the CPU backend (some Gaussians
    culled)."""
    from test_cuda_emulation_project_3dgs import scene

    from splat import rasterize_3dgs

    s = scene(2000, torch.float64, width=96, height=64)
    leaves = {k: s[k] for k in ("means", "quats", "scales", "opacities")}
    leaves["colors"] = torch.rand(2000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _check_fused_projection_choice(
        monkeypatch,
        "project_gaussians_forward_cuda",
        camera_grad,
        s,
        leaves,
        lambda *a: rasterize_3dgs(*a, s["width"], s["height"], near=0.2, far=100.0),
        fused=True,
    )
