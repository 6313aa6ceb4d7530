"""Huge primitives (scales up to e^30 and beyond, a PLY with ``scale_*`` = 20):
both primitives, float32 and float64, every CPU backend.  Each either draws
what it should (a footprint far wider than the image: alpha = opacity
everywhere) with a screen radius clamped to ``conventions.RADIUS_MAX`` (never
an int32 overflow to a negative radius) and finite gradients, or is refused
with one line; it never silently vanishes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from splat import conventions as cv, rasterize
from splat.rasterize_3dgs import rasterize_3dgs

W = H = 24
OPACITY = 0.5


def _camera(dtype):
    """fx = 500 px at 4 units: a Gaussian e^19 wide has a 2D covariance of
    ~5e20 px^2, whose determinant overflows float32."""
    K = torch.tensor([[500.0, 0.0, W / 2], [0.0, 500.0, H / 2], [0.0, 0.0, 1.0]], dtype=dtype)
    return torch.eye(4, dtype=dtype), K


def _render(primitive, log_scale, dtype, backend, requires_grad=False):
    viewmat, K = _camera(dtype)
    n_scales = 3 if primitive == "3dgs" else 2
    log_scales = torch.full((1, n_scales), log_scale, dtype=dtype, requires_grad=requires_grad)
    means = torch.tensor([[0.1, -0.05, 4.0]], dtype=dtype, requires_grad=requires_grad)
    quats = torch.tensor([[0.9, 0.1, 0.2, 0.3]], dtype=dtype)
    opacities = torch.full((1,), OPACITY, dtype=dtype, requires_grad=requires_grad)
    colors = torch.tensor([[0.2, 0.6, 0.9]], dtype=dtype, requires_grad=requires_grad)
    fn = rasterize_3dgs if primitive == "3dgs" else rasterize
    out = fn(means, quats, log_scales.exp(), opacities, colors, viewmat, K, W, H, backend=backend)
    return out, (means, log_scales, opacities, colors)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("primitive", ["3dgs", "2dgs"])
@pytest.mark.parametrize("log_scale", [18.0, 19.0, 20.0, 30.0])
def test_a_huge_primitive_draws_with_a_clamped_radius_or_is_refused(primitive, dtype, backend, log_scale):
    try:
        out, leaves = _render(primitive, log_scale, dtype, backend, requires_grad=True)
    except ValueError as e:  # refused: one line, naming the rows and the float type
        assert "\n" not in str(e) and "rows [0]" in str(e) and str(dtype) in str(e), str(e)
        assert dtype == torch.float32, f"float64 holds this footprint: {e}"
        return
    radius = int(out.radii[0])
    assert max(W, H) <= radius <= cv.RADIUS_MAX, radius  # far wider than the image, not an int32 overflow
    assert torch.allclose(out.alpha, torch.full_like(out.alpha, OPACITY), atol=1e-3), float(out.alpha.min())
    (out.rgb.sum() + out.alpha.sum()).backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_3d_gaussians_up_to_float32s_range_are_drawn_in_float32(dtype):
    """The kernels draw what the reference draws (the conic's determinant no
    longer overflows float32); past what float32 holds, one line."""
    for log_scale in (19.0, 20.0, 30.0, 38.0):  # e^38: a 2D covariance of ~2e37 px^2, still a float32
        cpu, _ = _render("3dgs", log_scale, dtype, "cpu")
        ref, _ = _render("3dgs", log_scale, dtype, "torch")
        assert torch.allclose(cpu.alpha, ref.alpha, atol=1e-5) and float(cpu.alpha.min()) > 0.49, log_scale
        assert torch.equal(cpu.radii, ref.radii)
    with pytest.raises(ValueError, match=r"Gaussians at rows \[0\] are too thin or too large for torch.float32"):
        _render("3dgs", 45.0, torch.float32, "cpu")


def test_a_ply_with_scale_20_renders_the_gaussian(tmp_path):
    """INRIA-layout PLY, three log-scales of 20: loads and renders (float32,
    as render.py does) a 3D Gaussian covering the image, not an empty one."""
    from plyfile import PlyData, PlyElement

    from splat.model_render import render_frame
    from splat.ply import PLY_PRIMITIVE_COMMENT, load_ply, ply_attribute_names

    path = tmp_path / "huge.ply"
    arr = np.zeros(1, dtype=[(n, "f4") for n in ply_attribute_names(0)])
    arr["z"], arr["rot_0"], arr["opacity"], arr["f_dc_0"] = 4.0, 1.0, 0.0, 1.0  # opacity logit 0: 0.5
    for i in range(3):
        arr[f"scale_{i}"] = 20.0
    PlyData([PlyElement.describe(arr, "vertex")], comments=[f"{PLY_PRIMITIVE_COMMENT} 3dgs"]).write(str(path))
    model = load_ply(path)
    assert model.primitive == "3dgs" and model.params["means"].dtype == torch.float32
    viewmat, K = _camera(torch.float32)

    class Frame:
        width, height = W, H

    Frame.viewmat, Frame.K = viewmat, K
    for backend in ("cpu", "torch"):
        out = render_frame(model, Frame, backend=backend)
        assert torch.allclose(out.alpha, torch.full_like(out.alpha, 0.5), atol=1e-3), (backend, float(out.alpha.min()))
        assert 0 < int(out.radii[0]) <= cv.RADIUS_MAX


def test_radii_are_clamped_not_wrapped():
    r = torch.tensor([0.0, 3.0, 2.0**31, 1e300, math.inf], dtype=torch.float64)
    assert cv.radii_int32(r).tolist() == [0, 3, cv.RADIUS_MAX, cv.RADIUS_MAX, cv.RADIUS_MAX]
