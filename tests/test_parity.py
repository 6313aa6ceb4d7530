"""CPU kernels against the PyTorch reference: every output and every gradient.

float64: both sides compute the same function in different ways (screen-plane
intersection vs Cramer's rule, loops vs cumulative products), so they agree to
rounding: we require 1e-9 relative to each tensor's largest magnitude.

float32: the float32 kernel is compared with the float64 reference (the
truth).  Rounding in the sums and in the back-to-front recovery of T (division
by 1 - alpha) gives measured relative errors up to 7e-6 for values and 5e-5
for gradients (larger through near-singular intersections, du/dq ~ 1/q2); we
require values within 5e-5 and gradients within 5e-4 of each tensor's largest
magnitude, about 10x the measured error.  A wrong term shows up at O(1)
relative error, far above this.
"""

import pytest
import torch
from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves

from splat.testing import random_scene, surface_scene


def _scenes():
    yield "random", random_scene(40, 48, 36, seed=0, principal_offset=(5.5, -4.0), aspect=0.9)
    yield "dense", random_scene(120, 40, 40, seed=7, scale_range=(0.2, 0.6))
    s = surface_scene(800, 64, 48, dtype=torch.float64, seed=2)
    yield "surfaces", s


SCENES = dict(_scenes())
TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (5e-5, 5e-4)}  # (values, gradients), relative to max


def _max_rel(a, b):
    scale = max(float(b.detach().abs().max()), 1e-12)
    return float((a.detach().double() - b.detach().double()).abs().max()) / scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(SCENES))
def test_cpu_matches_reference(name, dtype):
    scene = SCENES[name]
    ref_params = leaves(scene)
    ref_params["background"] = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64, requires_grad=True)
    ref_out, ref_grads = all_grads(ref_params, camera(scene), "torch", cotangents_for(scene))
    params = {k: v.detach().to(dtype).requires_grad_(True) for k, v in ref_params.items()}
    weights = {k: w.to(dtype) for k, w in cotangents_for(scene).items()}
    out, grads = all_grads(params, camera(scene, dtype), "cpu", weights)
    value_tol, grad_tol = TOL[dtype]
    assert float(ref_out.alpha.detach().max()) > 0.5
    for k in OUTPUTS:
        assert getattr(out, k).dtype == dtype
        err = _max_rel(getattr(out, k), getattr(ref_out, k))
        assert err <= value_tol, f"{k}: relative error {err:.2e}"
    assert torch.equal(out.radii, ref_out.radii)
    for k in ref_grads:
        err = _max_rel(grads[k], ref_grads[k])
        assert err <= grad_tol, f"d/d{k}: relative error {err:.2e}"


_WEIGHTS = {}


def cotangents_for(scene):
    """The same loss weights for both sides (made once per scene, in float64)."""
    key = id(scene)
    if key not in _WEIGHTS:
        from rasterize_helpers import render

        with torch.no_grad():
            _WEIGHTS[key] = cotangents(render(leaves(scene), camera(scene), "cpu"))
    return _WEIGHTS[key]


def test_sh_colours_match_reference():
    scene = SCENES["random"]
    g = torch.Generator().manual_seed(4)
    sh = torch.randn(scene["means"].shape[0], 16, 3, generator=g, dtype=torch.float64) * 0.3
    for degree in (0, 1, 3):
        results = []
        for backend in ("torch", "cpu"):
            params = leaves(dict(scene, colors=sh))
            out, grads = all_grads(params, camera(scene), backend, cotangents_for(scene), sh_degree=degree)
            results.append((out.rgb, grads["colors"], grads["means"]))
        for a, b in zip(*results):
            assert _max_rel(b, a) <= 1e-9
        # coefficients above the active degree get no gradient
        tail = results[1][1][:, (degree + 1) ** 2 :]
        assert tail.numel() == 0 or float(tail.abs().max()) == 0.0


def test_cpu_gradients_are_deterministic_across_runs_and_threads():
    scene = SCENES["dense"]
    torch_threads = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 2, 1):
            torch.set_num_threads(threads)
            params = leaves(scene, torch.float32)
            _, grads = all_grads(
                params, camera(scene, torch.float32), "cpu", {k: v.float() for k, v in cotangents_for(scene).items()}
            )
            results.append(grads)
    finally:
        torch.set_num_threads(torch_threads)
    for other in results[1:]:
        for k in results[0]:
            assert torch.equal(results[0][k], other[k]), f"d/d{k} differs between runs"
