"""Float64 central differences against the analytic gradients.

For each scene and each output, loss = <W, output> with fixed random weights W;
every input element is perturbed by +-h and the central difference is compared
with autograd.  With h = 1e-6 in float64 the difference has truncation error
~h^2 |f'''| ~ 1e-12 and rounding error ~eps |f| / h ~ 1e-10 |f|, so we require
|analytic - numeric| <= 1e-6 + 1e-5 |analytic| (scenes are chosen so that no
sample sits within h of a discontinuity: alpha clamp, 1/255 cut, T floor,
fallback switch, median switch).
"""

import pytest
import torch
from rasterize_helpers import OUTPUTS, all_grads, camera, cotangents, leaves, render, weighted_loss

from splat.testing import random_scene

H_STEP = 1e-6
ATOL, RTOL = 1e-6, 1e-5


def scenes():
    # off-centre principal point and a non-square image, skewed aspect
    yield "offcentre", random_scene(14, 24, 17, seed=3, principal_offset=(4.3, -3.1), aspect=1.15)
    # many overlapping layers: big surfels stacked in a small volume
    s = random_scene(16, 16, 16, seed=5, scale_range=(0.5, 0.9), depth=5.0)
    s["means"] = s["means"] * 0.3
    yield "layers", s
    # partly visible (spread beyond the borders) and grazing surfels, plus tiny
    # ones that only the low-pass fallback draws
    s = random_scene(14, 20, 14, seed=11, principal_offset=(-2.0, 1.5))
    s["means"] = s["means"] * torch.tensor([2.2, 2.0, 1.0], dtype=torch.float64)
    s["quats"][:4] = torch.tensor([0.70710678, 0.70710678, 0.0, 0.01], dtype=torch.float64)  # ~edge-on
    s["scales"][-3:] = 0.004  # sub-pixel
    s["means"][-3:] = torch.tensor([[0.1, 0.05, -0.3], [-0.2, 0.1, 0.2], [0.3, -0.1, 0.0]], dtype=torch.float64)
    yield "border_grazing_tiny", s


SCENES = dict(scenes())


def _numeric_grad(params, cam, backend, weights, names, key):
    flat = params[key].detach().reshape(-1)
    numeric = torch.zeros_like(flat)
    for i in range(flat.numel()):
        vals = []
        for sign in (1, -1):
            p = {k: v.detach().clone() for k, v in params.items()}
            p[key].reshape(-1)[i] += sign * H_STEP
            with torch.no_grad():
                vals.append(weighted_loss(render(p, cam, backend), weights, names))
        numeric[i] = (vals[0] - vals[1]) / (2 * H_STEP)
    return numeric.reshape(params[key].shape)


def _check(scene, backend, names):
    params = leaves(scene)
    params["background"] = torch.tensor([0.3, 0.6, 0.2], dtype=torch.float64, requires_grad=True)
    cam = camera(scene)
    out = render(params, cam, backend)
    assert out.alpha.max() > 0.5, "scene must be visible"
    weights = cotangents(out)
    _, grads = all_grads(params, cam, backend, weights, names)
    for key in params:
        numeric = _numeric_grad(params, cam, backend, weights, names, key)
        err = (grads[key] - numeric).abs()
        bound = ATOL + RTOL * grads[key].abs()
        assert bool((err <= bound).all()), (
            f"{backend} d{'+'.join(names)}/d{key}: max err {err.max():.3e} "
            f"at {int(err.argmax())}, analytic {grads[key].reshape(-1)[err.argmax()]:.6e}, "
            f"numeric {numeric.reshape(-1)[err.argmax()]:.6e}"
        )


@pytest.mark.parametrize("scene", list(SCENES))
@pytest.mark.parametrize("output", OUTPUTS)
def test_cpu_backend_matches_finite_differences(scene, output):
    _check(SCENES[scene], "cpu", (output,))


@pytest.mark.parametrize("scene", list(SCENES))
def test_reference_matches_finite_differences(scene):
    # The oracle is checked too, on all outputs at once (it is slow).
    _check(SCENES[scene], "torch", OUTPUTS)


def test_means2d_gradient_is_a_screen_translation():
    """means2d.grad is dL/d(translating the footprint in pixels), checked by moving
    the camera's principal point, which translates every footprint at once."""
    scene = SCENES["offcentre"]
    params = leaves(scene)
    cam = camera(scene)
    out = render(params, cam, "cpu")
    weights = cotangents(out)
    _, grads = all_grads(params, cam, "cpu", weights)
    for axis in range(2):
        vals = []
        for sign in (1, -1):
            c = dict(cam, K=cam["K"].clone())
            c["K"][axis, 2] += sign * H_STEP
            with torch.no_grad():
                vals.append(weighted_loss(render(params, c, "cpu"), weights))
        numeric = (vals[0] - vals[1]) / (2 * H_STEP)
        analytic = grads["means2d"][:, axis].sum()
        assert abs(float(analytic - numeric)) <= ATOL + RTOL * abs(float(analytic))


def test_scenes_exercise_both_branches_of_the_lowpass_fallback():
    """The tiny surfels are drawn (only by the fallback) and the big ones by the 3D branch."""

    scene = SCENES["border_grazing_tiny"]
    params = leaves(scene)
    cam = camera(scene)
    out = render(params, cam, "cpu")
    assert (out.radii[-3:] > 0).all()
    # Removing the tiny surfels changes the image: they contribute.
    trimmed = {k: v[:-3] for k, v in params.items()}
    assert not torch.allclose(render(trimmed, cam, "cpu").alpha, out.alpha)
