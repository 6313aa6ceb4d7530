"""Bad input gets a clear error, or documented behaviour; never a crash or silent NaN."""

import pytest
import torch
from rasterize_helpers import PARAMS, camera, leaves, render

import splat
from splat.testing import random_scene

BACKENDS = ["cpu", "torch"]


@pytest.fixture
def scene():
    return random_scene(12, 20, 16, seed=1)


def _call(scene, **overrides):
    args = dict(scene)
    args.update(overrides)
    return splat.rasterize(
        args["means"],
        args["quats"],
        args["scales"],
        args["opacities"],
        args["colors"],
        args["viewmat"],
        args["K"],
        args["width"],
        args["height"],
        **{k: v for k, v in overrides.items() if k in ("near", "far", "background", "sh_degree", "backend")},
    )


@pytest.mark.parametrize(
    "name,bad,message",
    [
        ("means", lambda s: s["means"][:, :2], "means must have shape"),
        ("quats", lambda s: s["quats"][:-1], "quats must have shape"),
        ("scales", lambda s: torch.cat([s["scales"], s["scales"][:, :1]], 1), "scales must have shape"),
        ("opacities", lambda s: s["opacities"][:, None], "opacities must have shape"),
        ("colors", lambda s: s["colors"][:, :2], "colors must have shape"),
        ("viewmat", lambda s: s["viewmat"][:3], "viewmat must have shape"),
        ("K", lambda s: s["K"][:2], "K must have shape"),
    ],
)
def test_wrong_shapes_name_the_tensor(scene, name, bad, message):
    with pytest.raises(ValueError, match=message):
        _call(scene, **{name: bad(scene)})


def test_wrong_dtypes_and_devices(scene):
    with pytest.raises(TypeError, match="quats has dtype torch.float32"):
        _call(scene, quats=scene["quats"].float())
    with pytest.raises(TypeError, match="float32 or float64"):
        _call(scene, means=scene["means"].half())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        _call(scene, scales=scene["scales"].numpy())
    with pytest.raises(ValueError, match="on meta"):
        _call(scene, colors=scene["colors"].to("meta"))
    with pytest.raises(ValueError, match="backend='cuda' needs CUDA tensors"):
        _call(scene, backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        _call(scene, backend="vulkan")


def test_bad_cameras_and_sizes(scene):
    with pytest.raises(ValueError, match="positive int"):
        _call(scene, width=0)
    with pytest.raises(ValueError, match="positive int"):
        _call(scene, height=12.5)
    with pytest.raises(ValueError, match="width=100000 is larger than 65536"):
        _call(scene, width=100_000)
    with pytest.raises(ValueError, match="near < far"):
        _call(scene, near=0.0)
    with pytest.raises(ValueError, match="near < far"):
        _call(scene, near=5.0, far=1.0)
    scaled = scene["viewmat"].clone()
    scaled[:3, :3] *= 2
    with pytest.raises(ValueError, match="rigid"):
        _call(scene, viewmat=scaled)
    K = scene["K"].clone()
    K[2, 2] = 2
    with pytest.raises(ValueError, match="K must be"):
        _call(scene, K=K)


@pytest.mark.parametrize("name", PARAMS)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_parameters_are_refused(scene, name, value):
    bad = scene[name].clone()
    bad.view(-1)[5] = value
    with pytest.raises(ValueError, match=f"{name} contains NaN or Inf"):
        _call(scene, **{name: bad})


def test_zero_quaternion_and_negative_scales_and_opacity_range(scene):
    q = scene["quats"].clone()
    q[3] = 0
    with pytest.raises(ValueError, match="zero-length quaternions at rows \\[3\\]"):
        _call(scene, quats=q)
    s = scene["scales"].clone()
    s[2, 1] = -0.1
    with pytest.raises(ValueError, match="scales must be >= 0"):
        _call(scene, scales=s)
    o = scene["opacities"].clone()
    o[0] = 1.5
    with pytest.raises(ValueError, match="opacities must lie in \\[0, 1\\]"):
        _call(scene, opacities=o)
    with pytest.raises(ValueError, match="sh_degree=2, colors must be"):
        _call(scene, sh_degree=2)


def _finite_outputs_and_grads(scene, backend):
    params = leaves(scene)
    out = render(params, camera(scene), backend)
    loss = sum(getattr(out, k).sum() for k in ("rgb", "alpha", "depth", "median_depth", "normal", "distortion"))
    for k in ("rgb", "alpha", "depth", "median_depth", "normal", "distortion"):
        assert torch.isfinite(getattr(out, k)).all(), k
    if loss.requires_grad:
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for k, g in zip(params, grads):
            assert g is None or torch.isfinite(g).all(), f"non-finite gradient for {k}"
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_surfels_render_the_background(scene, backend):
    empty = {k: scene[k][:0] for k in PARAMS}
    bg = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)
    out = _call(scene, **empty, background=bg, backend=backend)
    assert out.rgb.shape == (16, 20, 3)
    assert torch.equal(out.rgb, bg.expand(16, 20, 3))
    assert float(out.alpha.abs().max()) == 0 and out.radii.shape == (0,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_everything_behind_the_camera(scene, backend):
    behind = dict(scene, means=scene["means"] * 0.1 - torch.tensor([0.0, 0.0, 10.0], dtype=torch.float64))
    out = _finite_outputs_and_grads(behind, backend)
    assert float(out.alpha.detach().max()) == 0 and int(out.radii.max()) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_camera_inside_the_scene(scene, backend):
    """Surfels all around the camera, some crossing the near plane: documented
    behaviour is that centres behind near are culled and samples whose
    intersection lies before near are skipped; everything stays finite."""
    g = torch.Generator().manual_seed(3)
    n = 40
    inside = dict(
        scene,
        means=torch.randn(n, 3, generator=g, dtype=torch.float64) * 0.6,
        quats=torch.randn(n, 4, generator=g, dtype=torch.float64),
        scales=torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.8 + 0.1,
        opacities=torch.rand(n, generator=g, dtype=torch.float64),
        colors=torch.rand(n, 3, generator=g, dtype=torch.float64),
        viewmat=torch.eye(4, dtype=torch.float64),
    )
    out = _finite_outputs_and_grads(inside, backend)
    assert float(out.alpha.detach().max()) > 0
    assert float(out.depth.detach()[out.alpha > 0].min()) > 0.2


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_surfels_stay_finite(scene, backend):
    """Zero scales (documented: drawn by the low-pass fallback only), exactly
    edge-on surfels, and tiny ones: finite values and gradients."""
    s = dict(scene)
    scales = s["scales"].clone()
    scales[0] = 0.0
    scales[1, 0] = 0.0
    scales[2] = 1e-9
    quats = s["quats"].clone()
    # normal along camera x: a surfel seen exactly edge-on by a camera on the axis
    quats[3] = torch.tensor([0.70710678118654757, 0.0, 0.70710678118654757, 0.0], dtype=torch.float64)
    s.update(scales=scales, quats=quats)
    out = _finite_outputs_and_grads(s, backend)
    assert (out.radii[:3] > 0).sum() >= 1  # drawn as screen-space blobs when in view


def test_cpu_and_reference_agree_on_degenerate_surfels(scene):
    s = dict(scene)
    scales = s["scales"].clone()
    scales[0] = 0.0
    scales[1, 0] = 0.0
    s["scales"] = scales
    a = render(leaves(s), camera(s), "cpu")
    b = render(leaves(s), camera(s), "torch")
    for k in ("rgb", "alpha", "depth", "distortion", "normal", "median_depth"):
        assert torch.allclose(getattr(a, k), getattr(b, k), rtol=1e-9, atol=1e-12), k


# ---------------------------------------------------------------------------
# Issue 9: culled surfels, dtype range, reflections, backward with nothing drawn
# ---------------------------------------------------------------------------
GRAD_BACKENDS = BACKENDS + (["cuda"] if torch.cuda.is_available() and splat._backend.has_cuda_kernels() else [])


def _on(scene, backend):
    device = "cuda" if backend == "cuda" else "cpu"
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}


def _grads_of_everything(scene, backend):
    """Outputs and the gradient of a loss on every output w.r.t. every input
    (viewmat, K and means2d included), via backward() as a user calls it."""
    s = _on(scene, backend)
    params = {k: s[k].detach().clone().requires_grad_(True) for k in PARAMS + ("viewmat", "K")}
    out = splat.rasterize(
        params["means"],
        params["quats"],
        params["scales"],
        params["opacities"],
        params["colors"],
        params["viewmat"],
        params["K"],
        s["width"],
        s["height"],
        backend=backend,
    )
    loss = sum(
        (getattr(out, k) * (1 + i)).sum()
        for i, k in enumerate(("rgb", "alpha", "depth", "median_depth", "normal", "distortion"))
    )
    out.means2d.retain_grad()
    loss.backward()
    grads = {k: p.grad for k, p in params.items()}
    grads["means2d"] = out.means2d.grad
    return out, grads


def _at_camera_depth(scene, row, z):
    """The scene seen by an identity camera (so camera depth = means z, exactly),
    with surfel ``row`` at camera depth ``z``."""
    means = scene["means"].clone()
    means[:, 2] += 4.0
    means[row, 2] = z
    return dict(scene, means=means, viewmat=torch.eye(4, dtype=means.dtype))


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
@pytest.mark.parametrize("z", [0.0, 1e-300, -1e-300, 0.1])
def test_surfel_at_camera_depth_zero_contributes_exactly_zero(scene, backend, z):
    """Issue 9, finding 3: a surfel at camera depth ~0 (culled) made means2d
    +-inf and the means, viewmat and K gradients NaN.  A culled surfel must
    add exactly nothing: finite means2d, zero gradients of its own, and the
    camera gradients of the scene without it."""
    culled = _at_camera_depth(scene, 4, z)
    out, g = _grads_of_everything(culled, backend)
    assert int(out.radii[4]) == 0
    assert torch.isfinite(out.means2d).all()
    for k, v in g.items():
        assert torch.isfinite(v).all(), k
    for k in PARAMS + ("means2d",):
        assert float(g[k][4].abs().max()) == 0.0, k
    without = {k: (v[torch.arange(12) != 4] if k in PARAMS else v) for k, v in culled.items()}
    _, g0 = _grads_of_everything(without, backend)
    for k in ("viewmat", "K"):
        assert torch.allclose(g[k], g0[k], rtol=1e-12, atol=1e-12), k
    for k in PARAMS:
        assert torch.allclose(g[k][torch.arange(12) != 4], g0[k], rtol=1e-12, atol=1e-12), k


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
@pytest.mark.parametrize("case", ["empty", "all_culled", "all_transparent"])
def test_backward_with_nothing_drawn_gives_zero_gradients(scene, backend, case):
    """N = 0, every surfel behind the camera, or every surfel below the alpha
    threshold: backward() works and every input gets an exact zero gradient."""
    if case == "empty":
        s = {k: (v[:0] if k in PARAMS else v) for k, v in scene.items()}
    elif case == "all_culled":
        s = dict(scene, means=scene["means"] * 0.1 - torch.tensor([0.0, 0.0, 10.0], dtype=torch.float64))
    else:
        s = dict(scene, opacities=torch.full_like(scene["opacities"], 1e-3))
    out, g = _grads_of_everything(s, backend)
    assert float(out.alpha.detach().abs().max()) == 0
    for k, v in g.items():
        assert v is not None, f"{k} got no gradient"
        assert v.shape == (s[k].shape if k in s else out.means2d.shape)
        assert not bool(v.any()), k


def test_float32_clip_range_the_dtype_cannot_carry(scene):
    """Issue 9, finding 5: far = 1e39 is inf in float32 (NaN distortion before)."""
    s32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}
    with pytest.raises(ValueError, match=r"far=1e\+39 is beyond the range of torch.float32"):
        _call(s32, far=1e39)
    with pytest.raises(ValueError, match="near=1e-30 is too small for torch.float32"):
        _call(s32, near=1e-30)
    with pytest.raises(ValueError, match="round to the same torch.float32 value"):
        _call(s32, near=1.0, far=1.0 + 1e-9)
    out = _call(scene, far=1e39)  # float64 carries it
    assert torch.isfinite(out.distortion).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_quaternions_are_normalised_exactly(scene, backend):
    """Issue 9, finding 5: float32 quats with |q| >= 2e19 became the identity
    rotation (|q|^2 overflowed).  They are normalised exactly now: the same
    image as the unit quaternions, with finite gradients."""
    s32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}
    unit = render(leaves(s32), camera(s32), backend)
    big = dict(s32, quats=s32["quats"] * 1e30)
    params = leaves(big)
    out = render(params, camera(big), backend)
    assert torch.allclose(out.rgb, unit.rgb, atol=1e-5)
    assert torch.allclose(out.normal, unit.normal, atol=1e-5)
    out.rgb.sum().backward()
    assert torch.isfinite(params["quats"].grad).all()
    tiny = s32["quats"].clone()
    tiny[2] = 1e-25
    with pytest.raises(ValueError, match=r"quats has zero-length quaternions at rows \[2\].*too small"):
        _call(s32, quats=tiny)


def test_float32_surfels_too_large_to_rasterize_are_refused(scene):
    """Issue 9, finding 5: float32 scales >= 1e20 silently became a low-pass blob."""
    s32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}
    scales = s32["scales"].clone()
    scales[3] = 1e20
    with pytest.raises(ValueError, match=r"surfels at rows \[3\] .*float32.* means or scales"):
        _call(s32, scales=scales)
    means = s32["means"].clone()
    means[5] = torch.tensor([1e30, 0.0, 3.0])  # in front of an identity camera, far off to the side:
    out = _call(s32, means=means, viewmat=torch.eye(4))  # never evaluated per pixel, so harmless
    assert int(out.radii[5]) == 0 and torch.isfinite(out.means2d).all()
    means[5] = torch.tensor([3e38, 0.0, 3.0])  # fx * 3e38 overflows float32
    with pytest.raises(ValueError, match=r"surfels at rows \[5\]"):
        _call(s32, means=means, viewmat=torch.eye(4))
    out = _call(scene, scales=scene["scales"] * 1e6)  # float64 carries it: one huge wall
    assert torch.isfinite(out.rgb).all()


def test_reflected_viewmat_is_refused(scene):
    """Issue 9, finding 6: a viewmat with determinant -1 was accepted."""
    flipped = scene["viewmat"].clone()
    flipped[0, :3] *= -1  # mirror camera x
    with pytest.raises(ValueError, match="viewmat .*determinant -1"):
        _call(scene, viewmat=flipped)


def _count_readbacks(monkeypatch):
    """Counts every read of a tensor's value into Python (on CUDA each waits for the GPU)."""
    counts = {"n": 0}
    for name in ("__bool__", "__float__", "__int__", "__index__", "item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize("background", [None, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)])
@pytest.mark.parametrize("positive_scales", [False, True])
def test_valid_inputs_are_checked_with_one_readback(scene, monkeypatch, background, positive_scales):
    """Every value test of valid inputs shares one readback (the GPU waits for each one), and an
    invalid value found by that one still gets its own message (the tests above)."""
    from splat.rasterize import _validate

    s = dict(scene)
    args = [s[k] for k in ("means", "quats", "scales", "opacities", "colors", "viewmat", "K", "width", "height")]
    if positive_scales:  # as rasterize_3dgs calls it
        args[2] = torch.cat([s["scales"], s["scales"][:, :1]], 1)
    counts = _count_readbacks(monkeypatch)
    _validate(*args, 0.2, 100.0, background, None, "cpu", num_scales=3 if positive_scales else 2,
              positive_scales=positive_scales)  # fmt: skip
    assert counts["n"] == 1
    # a sum that overflows while every element is finite: the quick test fails, the exact one passes
    big = torch.full_like(s["means"], 1e308)
    args[0] = big
    _validate(*args, 0.2, 1e300, background, None, "cpu", num_scales=3 if positive_scales else 2,
              positive_scales=positive_scales)  # fmt: skip
    assert counts["n"] > 1


def test_zero_scales_of_3d_gaussians_are_refused_naming_the_rows(scene):
    s = dict(scene)
    scales = torch.cat([s["scales"], s["scales"][:, :1]], 1)
    scales[3, 2] = 0.0
    with pytest.raises(ValueError, match=r"scales must be > 0 for 3D Gaussians .* not at rows \[3\]"):
        splat.rasterize_3dgs(s["means"], s["quats"], scales, s["opacities"], s["colors"], s["viewmat"], s["K"], 20, 16)
