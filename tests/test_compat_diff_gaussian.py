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

import numpy as np
import pytest
import torch
from device_agreement import agreement_tests
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


def test_a_second_backward_gives_the_same_gradients_and_gradcheck_passes():
    s = _scene(n=4, seed=5)
    cam = cam_from_viewmat(s["viewmat"], 8, 6, FOV0)
    settings = _settings(cam, antialiasing=False)
    names = ("means", "opacities", "colors", "scales", "quats")
    leaves = [(s[k][:, None] if k == "opacities" else s[k]).detach().clone().requires_grad_(True) for k in names]
    means2D = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    color, _, invdepths = GaussianRasterizer(settings)(
        leaves[0], means2D, leaves[1], colors_precomp=leaves[2], scales=leaves[3], rotations=leaves[4]
    )
    assert color.abs().sum() > 0 and invdepths.max() > 0
    loss = color.square().sum() + invdepths.sum()
    loss.backward(retain_graph=True)
    first = [t.grad.clone() for t in leaves + [means2D]]
    assert means2D.grad.abs().max() > 0
    for t in leaves + [means2D]:
        t.grad = None
    loss.backward()
    for t, g in zip(leaves + [means2D], first):
        assert torch.equal(t.grad, g)
    assert color.grad_fn.inner is None  # the inner graph is freed with the outer one
    # Without retain_graph the graph is gone, as torch's own are: its error, one line.
    with pytest.raises(RuntimeError, match="retain_graph=True") as err:
        loss.backward()
    assert "\n" not in str(err.value)
    unused = torch.zeros(4, 3, dtype=torch.float64)  # means2D's values are unused: no numerical derivative

    def f(means, opacities, colors, scales, quats):
        color, _, invdepths = GaussianRasterizer(settings)(
            means, unused, opacities, colors_precomp=colors, scales=scales, rotations=quats
        )
        return color, invdepths

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_numpy_and_tensor_scalars_in_the_settings_are_taken_as_numbers():
    """INRIA's binding takes numpy scalars and one-element tensors for its scalar
    fields; a wrong value in such a type still gets its one-line error."""
    s = _scene()
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    settings = _settings(cam, antialiasing=True)
    ref = _shim(settings, s)
    scalars = settings._replace(
        image_width=np.int64(W0),
        image_height=torch.tensor(H0),
        tanfovx=np.float32(settings.tanfovx),
        tanfovy=torch.tensor(settings.tanfovy),
        scale_modifier=np.float32(1.0),
        sh_degree=np.int64(0),
        prefiltered=np.bool_(False),
        debug=torch.tensor(False),
        antialiasing=np.bool_(True),
    )
    out = _shim(scalars, s)
    assert len(out) == 3 and all(torch.allclose(a.double(), b.double(), atol=1e-5) for a, b in zip(out, ref))
    assert _shim(scalars._replace(antialiasing=torch.tensor(False)), s)[0].shape == (3, H0, W0)
    for change, message in (
        (dict(tanfovx=np.float32(0.9)), "tanfovx=0.8999.* disagrees with projmatrix"),
        (dict(tanfovy=torch.tensor(2.0)), "tanfovy=2.0 disagrees with projmatrix"),
        (dict(tanfovx=None), "tanfovx must be a finite number > 0, got None"),
        (dict(image_width=np.float32(26.0)), "image_width must be a positive int, got 26.0"),
        (
            dict(image_height=torch.tensor([H0, H0])),
            r"image_height must be a positive int, got a tensor of shape \[2\]",
        ),
        (dict(antialiasing=np.int64(1)), "antialiasing must be a bool, got 1"),
        (dict(scale_modifier=np.float64("nan")), "scale_modifier must be a finite number >= 0, got nan"),
    ):
        with pytest.raises(ValueError, match=message) as err:
            _shim(scalars._replace(**change), s)
        assert "\n" not in str(err.value)


def _device_agreement_case():
    """INRIA's float32 inputs as its .cuda() calls give them: image, radii, inverse depth and gradients."""
    s = {k: v.float() for k, v in _scene().items()}
    cam = cam_from_viewmat(s["viewmat"], W0, H0, FOV0)
    settings = _settings(cam, antialiasing=False)
    inputs = dict(s, means2D=torch.zeros(s["means"].shape[0], 3))

    def render(p):
        dev = p["means"].device
        moved = settings._replace(
            **{k: getattr(settings, k).to(dev).float() for k in ("bg", "viewmatrix", "projmatrix", "campos")}
        )
        return _shim(moved, p, means2D=p["means2D"])

    return inputs, ("means", "means2D", "opacities", "colors", "scales", "quats"), render


# CUDA against the CPU where a GPU is (tests/device_agreement.py), and the case itself on the CPU.
test_cuda_tensors_run_on_cuda_and_agree_with_the_cpu, test_the_device_agreement_case_runs_on_the_cpu = agreement_tests(
    _device_agreement_case
)
