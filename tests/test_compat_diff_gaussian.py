"""splat.compat.diff_gaussian_rasterization: INRIA 3DGS's rasterizer interface on
splat.rasterize_3dgs (issue 22).

The camera comes from INRIA's own formulas (getWorld2View2,
getProjectionMatrix; tests/twodgs_style.py, which 2DGS took from INRIA), and
every claim of the module docstring is checked: the render equals
splat.rasterize_3dgs on the converted camera, the two API generations'
return shapes, INRIA's radii and inverse depth on known Gaussians, the
means2D gradient in NDC units, one-line errors, and the installable
distribution.
"""

from __future__ import annotations

import math

import pytest
import torch
from shim_install import assert_shim_installs
from twodgs_style import cam_from_viewmat, fov2focal

import splat
from splat.compat.diff_gaussian_rasterization import GaussianRasterizationSettings, GaussianRasterizer
from splat.testing import look_at_viewmat, random_gaussians

W0, H0, FOV0 = 26, 20, math.radians(60.0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _scene(n=12, seed=3):
    return dict(random_gaussians(n, seed), viewmat=look_at_viewmat((0.3, -0.2, -4.0), (0.0, 0.0, 0.0)))


def _settings(cam, antialiasing="absent", bg=(0.2, 0.4, 0.6), **kw):
    fields = dict(
        image_height=cam.image_height,
        image_width=cam.image_width,
        tanfovx=math.tan(cam.FoVx * 0.5),
        tanfovy=math.tan(cam.FoVy * 0.5),
        bg=torch.tensor(bg, dtype=torch.float64),
        scale_modifier=1.0,
        viewmatrix=cam.world_view_transform,
        projmatrix=cam.full_proj_transform,
        sh_degree=0,
        campos=cam.camera_center,
        prefiltered=False,
        debug=False,
    )
    fields.update(kw)
    if antialiasing != "absent":
        fields["antialiasing"] = antialiasing
    return GaussianRasterizationSettings(**fields)


def _shim(settings, s, means2D=None, **kw):
    n = s["means"].shape[0]
    means2D = torch.zeros(n, 3, dtype=torch.float64) if means2D is None else means2D
    return GaussianRasterizer(settings)(
        s["means"],
        means2D,
        s["opacities"][:, None],
        colors_precomp=s["colors"],
        scales=s["scales"],
        rotations=s["quats"],
        **kw,
    )


def _splat(s, cam, bg=(0.2, 0.4, 0.6), **kw):
    """splat.rasterize_3dgs on the camera INRIA's settings describe (K from INRIA's own quantities)."""
    W, H = cam.image_width, cam.image_height
    K = torch.tensor(
        [[fov2focal(cam.FoVx, W), 0, W / 2], [0, fov2focal(cam.FoVy, H), H / 2], [0, 0, 1]], dtype=torch.float64
    )
    return splat.rasterize_3dgs(
        s["means"],
        s["quats"],
        s["scales"],
        s["opacities"],
        s["colors"],
        cam.world_view_transform.T.double(),
        K,
        W,
        H,
        near=0.2,
        far=1e10,
        background=torch.tensor(bg, dtype=torch.float64),
        **kw,
    )


def test_original_and_current_module_return_shapes():
    s = _scene()
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    old = _shim(_settings(cam), s)
    new = _shim(_settings(cam, antialiasing=False), s)
    assert len(old) == 2 and len(new) == 3
    assert old[0].shape == (3, H0, W0) and old[1].shape == (12,) and old[1].dtype == torch.int32
    assert new[2].shape == (1, H0, W0)
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])


@pytest.mark.parametrize("antialiasing", [False, True])
def test_colour_is_splats_on_the_converted_camera(antialiasing):
    s = _scene()
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    color, radii, _ = _shim(_settings(cam, antialiasing=antialiasing), s)
    ref = _splat(s, cam, antialiased=antialiasing)
    assert torch.allclose(color, ref.rgb.permute(2, 0, 1), atol=1e-6)  # the camera passes through float32
    assert torch.equal(radii > 0, ref.radii > 0)


def test_radii_and_inverse_depth_of_one_gaussian_are_inrias():
    """One isotropic Gaussian (sigma s at depth z, focal f): INRIA's radius is
    ceil(3 sqrt(f^2 s^2 / z^2 + 0.3)); its inverse depth is alpha / z_centre."""
    s = _scene(n=1)
    s["means"][0] = torch.tensor([0.1, -0.05, 0.2], dtype=torch.float64)
    s["scales"][0] = 0.3
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    _, radii, invdepths = _shim(_settings(cam, antialiasing=False), s)
    z = float(s["means"][0] @ s["viewmat"][2, :3] + s["viewmat"][2, 3])
    f = fov2focal(FOV0, W0)
    # The mean sits near the image centre, where EWA's Jacobian is f / z on both axes to 1 %.
    expected = 3 * math.sqrt((f * 0.3 / z) ** 2 + 0.3)
    assert abs(int(radii[0]) - math.ceil(expected)) <= 1
    alpha = _splat(s, cam).alpha
    assert torch.allclose(invdepths[0], (alpha / z).float().double(), atol=1e-6)


def test_means2d_gradient_is_the_translation_gradient_in_ndc_units():
    s = {k: v.clone().requires_grad_(k == "means") for k, v in _scene().items()}
    cam = cam_from_viewmat(s["viewmat"].detach(), W0, H0, FOV0)
    means2D = torch.zeros(12, 3, dtype=torch.float64, requires_grad=True)
    color, _, invdepths = _shim(_settings(cam, antialiasing=False), s, means2D=means2D)
    (color.square().sum() + invdepths.sum()).backward()
    ref = _splat(s, cam)
    ref.rgb.square().sum().backward()
    # the inverse-depth pass moves with the footprint too: its share is in the shim's gradient
    assert torch.all(means2D.grad[:, 2] == 0)
    inv_only = means2D.grad.clone()
    means2D.grad = None
    color, _, invdepths = _shim(_settings(cam, antialiasing=False), s, means2D=means2D)
    color.square().sum().backward()
    scale = torch.tensor([W0 / 2, H0 / 2], dtype=torch.float64)
    assert torch.allclose(means2D.grad[:, :2], ref.means2d.grad * scale, rtol=1e-5, atol=1e-8)
    assert not torch.allclose(inv_only, means2D.grad)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(cov3D_precomp=torch.zeros(12, 6, dtype=torch.float64)), "cov3D_precomp"),
    ],
)
def test_arguments_it_cannot_take_raise_one_line_errors(kwargs, name):
    s = _scene()
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    n = s["means"].shape[0]
    with pytest.raises(ValueError, match=name) as e:
        GaussianRasterizer(_settings(cam))(
            s["means"], torch.zeros(n, 3), s["opacities"][:, None], colors_precomp=s["colors"], **kwargs
        )
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"scales must have shape \[12, 3\]"):
        GaussianRasterizer(_settings(cam))(
            s["means"],
            torch.zeros(n, 3),
            s["opacities"][:, None],
            colors_precomp=s["colors"],
            scales=s["scales"][:, :2],
            rotations=s["quats"],
        )


def test_shim_distribution_installs_offline_and_imports_splats_classes(tmp_path):
    assert_shim_installs(
        tmp_path,
        "diff-gaussian-rasterization",
        "diff_gaussian_rasterization",
        ("GaussianRasterizer", "GaussianRasterizationSettings", "rasterize_gaussians"),
    )
