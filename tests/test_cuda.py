"""CUDA backend against the CPU backend (skipped without a GPU and CUDA kernels).

float64 runs the same core.h on both sides (nvcc built with --fmad=false and
IEEE division), so values and gradients agree to 1e-9 relative (atomics only
reorder the sums).  float32: exp differs by an ulp between glibc and CUDA and
atomics reorder sums, so we allow 1e-5 on values and 1e-3 on gradients,
relative to each tensor's largest magnitude.
"""
import pytest
import torch

from splat._backend import has_cuda_kernels
from splat.testing import random_scene, surface_scene

from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves, render

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and has_cuda_kernels()),
                                reason="needs a GPU and splat built with CUDA kernels")

TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-5, 1e-3)}


def _to(params, device, dtype):
    return {k: v.detach().to(device=device, dtype=dtype).requires_grad_(True) for k, v in params.items()}


def _cam(scene, device, dtype):
    c = camera(scene, dtype)
    return dict(c, viewmat=c["viewmat"].to(device), K=c["K"].to(device))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scene", [random_scene(60, 70, 45, seed=0, principal_offset=(7.0, -3.0)),
                                   surface_scene(5000, 160, 120, dtype=torch.float64, seed=1)],
                         ids=["random", "surfaces"])
def test_cuda_matches_cpu(scene, dtype):
    base = leaves(scene)
    base["background"] = torch.tensor([0.3, 0.1, 0.8], dtype=torch.float64)
    with torch.no_grad():
        weights = cotangents(render(base, camera(scene), "cpu"))
    w = {k: v.to(dtype) for k, v in weights.items()}
    cpu_out, cpu_grads = all_grads(_to(base, "cpu", dtype), _cam(scene, "cpu", dtype), "cpu", w)
    gpu_out, gpu_grads = all_grads(_to(base, "cuda", dtype), _cam(scene, "cuda", dtype), "cuda",
                                   {k: v.cuda() for k, v in w.items()})
    value_tol, grad_tol = TOL[dtype]
    for k in OUTPUTS:
        a, b = getattr(gpu_out, k).detach().cpu(), getattr(cpu_out, k).detach()
        assert float((a - b).abs().max()) <= value_tol * max(float(b.abs().max()), 1e-12), k
    assert torch.equal(gpu_out.radii.cpu(), cpu_out.radii)
    for k in cpu_grads:
        a, b = gpu_grads[k].cpu(), cpu_grads[k]
        assert float((a - b).abs().max()) <= grad_tol * max(float(b.abs().max()), 1e-12), f"d/d{k}"
