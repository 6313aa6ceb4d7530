"""splat.compat.gsplat.rasterization: gsplat 1.5's 3DGS entry point over
splat.rasterize_3dgs (issue 22).

Layouts and values against splat.rasterize_3dgs per camera, conics and the
antialiasing compensation against gsplat's own pure-PyTorch projection,
the means2d densification gradient, one-line errors, and gsplat's
DefaultStrategy driven by the returned meta (gsplat installs as pure Python
on the CPU; its pure-PyTorch compositing needs nerfacc, a CUDA package, so
rgb and alpha are checked against splat's independent per-pixel loop in
tests/test_reference_3dgs.py instead)."""

import pytest
import torch
from device_agreement import agreement_tests

import splat
from splat.compat import gsplat as shim
from splat.testing import intrinsics, look_at_viewmat, random_gaussians

WIDTH, HEIGHT = 24, 17


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _scene(n=12, seed=3, dtype=torch.float64):
    p = dict(
        random_gaussians(n, seed),
        viewmats=torch.stack(
            [look_at_viewmat((0.3, -0.2, -4.0), (0.0, 0.0, 0.0)), look_at_viewmat((-0.6, 0.4, -4.2), (0.1, 0.0, 0.0))]
        ),
        Ks=torch.stack([intrinsics(WIDTH, HEIGHT, 60.0, (4.3, -3.1), 1.15), intrinsics(WIDTH, HEIGHT, 55.0)]),
        backgrounds=torch.tensor([[0.3, 0.6, 0.2], [0.9, 0.1, 0.4]], dtype=torch.float64),
    )
    return {k: v.to(dtype) for k, v in p.items()}


def _call(p, **kw):
    args = [p[k] for k in ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks")]
    return shim.rasterization(
        *args, WIDTH, HEIGHT, backgrounds=p.get("backgrounds"), **{"near_plane": 0.2, "far_plane": 100.0, **kw}
    )


def _single(p, c, **kw):
    bg = p.get("backgrounds")
    return splat.rasterize_3dgs(
        p["means"],
        p["quats"],
        p["scales"],
        p["opacities"],
        p["colors"],
        p["viewmats"][c],
        p["Ks"][c],
        WIDTH,
        HEIGHT,
        near=0.2,
        far=100.0,
        background=None if bg is None else bg[c],
        **kw,
    )


@pytest.mark.parametrize("mode, channels", [("RGB", 3), ("D", 1), ("ED", 1), ("RGB+D", 4), ("RGB+ED", 4)])
def test_render_modes_and_extra_outputs_are_splats(mode, channels):
    p = _scene()
    if not mode.startswith("RGB"):
        p.pop("backgrounds")
    colors, alphas, meta = _call(p, render_mode=mode)
    assert colors.shape == (2, HEIGHT, WIDTH, channels) and alphas.shape == (2, HEIGHT, WIDTH, 1)
    for c in range(2):
        ref = _single(p, c)
        if mode.startswith("RGB"):
            assert torch.equal(colors[c, ..., :3], ref.rgb)
        if mode.endswith("ED"):
            assert torch.equal(colors[c, ..., -1], ref.depth)
        elif mode.endswith("D"):
            assert torch.equal(colors[c, ..., -1], ref.depth * ref.alpha)
        assert torch.equal(alphas[c, ..., 0], ref.alpha)
        assert torch.equal(meta["render_normals"][c], ref.normal)
        assert torch.equal(meta["render_distort"][c, ..., 0], ref.distortion)
        assert torch.equal(meta["render_median"][c, ..., 0], ref.median_depth)


@pytest.mark.parametrize("antialiased", [False, True])
def test_meta_conics_and_opacities_match_gsplats_projection(antialiased):
    torch_impl = pytest.importorskip("gsplat.cuda._torch_impl")
    p = _scene()
    p["means"][0] = torch.tensor([0.0, 0.0, -20.0], dtype=torch.float64)  # behind both cameras
    _, _, meta = _call(p, packed=False, rasterize_mode="antialiased" if antialiased else "classic")
    quats = p["quats"] / p["quats"].norm(dim=-1, keepdim=True)
    covars, _ = torch_impl._quat_scale_to_covar_preci(quats, p["scales"], compute_preci=False)
    _, means2d, depths, conics, comp = torch_impl._fully_fused_projection(
        p["means"], covars, p["viewmats"], p["Ks"], WIDTH, HEIGHT, eps2d=0.3, calc_compensations=antialiased
    )
    seen = (meta["radii"] > 0).all(-1)  # [C, N]
    assert not bool(seen[:, 0].any()) and bool(seen.sum() > 10)
    assert torch.allclose(meta["conics"][seen], conics[seen], rtol=1e-10, atol=1e-12)
    assert torch.allclose(meta["means2d"][seen], means2d[seen], rtol=1e-10, atol=1e-10)
    assert torch.allclose(meta["depths"], depths, rtol=1e-12, atol=1e-12)
    expected = p["opacities"].expand(2, -1) * (comp if antialiased else 1.0)
    assert torch.allclose(meta["opacities"][seen], expected[seen], rtol=1e-10, atol=1e-12)


def test_packed_meta_is_the_unpacked_meta_at_the_visible_pairs():
    p = _scene()
    _, _, full = _call(p, packed=False)
    _, _, packed = _call(p, packed=True)
    cams, ids = packed["camera_ids"], packed["gaussian_ids"]
    assert torch.equal((full["radii"] > 0).all(-1).nonzero(as_tuple=True)[0], cams)
    for key in ("radii", "means2d", "depths", "conics", "opacities"):
        assert torch.equal(packed[key], full[key][cams, ids]), key
    for key in ("width", "height", "n_cameras", "tile_width", "tile_height"):
        assert packed[key] == full[key]
    with pytest.raises(KeyError, match="tile-binning internals"):
        packed["isect_ids"]


@pytest.mark.parametrize("packed", [False, True])
def test_means2d_grad_is_each_cameras_screen_translation_gradient(packed):
    p = {k: v.requires_grad_(True) for k, v in _scene().items()}
    colors, _, meta = _call(p, packed=packed, render_mode="RGB+ED")
    colors.square().sum().backward()
    for c in range(2):
        ref = _single(p, c)
        torch.cat([ref.rgb, ref.depth[..., None]], -1).square().sum().backward()
        expected = ref.means2d.grad
        if packed:
            rows = meta["camera_ids"] == c
            assert torch.allclose(meta["means2d"].grad[rows], expected[meta["gaussian_ids"][rows]])
        else:
            assert torch.allclose(meta["means2d"].grad[c], expected)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(distributed=True), "distributed"),
        (dict(camera_model="fisheye"), "camera_model"),
        (dict(covars=torch.eye(3)), "covars"),
        (dict(eps2d=0.1), "eps2d"),
        (dict(rasterize_mode="mip"), "rasterize_mode"),
        (dict(absgrad=True), "absgrad"),
        (dict(sparse_grad=True), "sparse_grad"),
    ],
)
def test_unsupported_arguments_raise_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name) as e:
        _call(_scene(), **kwargs)
    assert "\n" not in str(e.value)


def test_two_scales_are_refused():
    p = _scene()
    p["scales"] = p["scales"][:, :2]
    with pytest.raises(ValueError, match=r"scales must be \[N, 3\]"):
        _call(p)


def test_meta_drives_gsplat_default_strategy():
    """gsplat's own DefaultStrategy (3DGS: key means2d) accumulates and
    refines from the meta, packed and unpacked alike."""
    gsplat_strategy = pytest.importorskip("gsplat.strategy")
    p = _scene(dtype=torch.float32)
    n = p["means"].shape[0]
    grad2d = {}
    for packed in (False, True):
        params = torch.nn.ParameterDict(
            {
                "means": p["means"].clone(),
                "quats": p["quats"].clone(),
                "scales": p["scales"].log(),
                "opacities": torch.logit(p["opacities"]),
                "colors": p["colors"].clone(),
            }
        )
        optimizers = {k: torch.optim.Adam([v], lr=1e-3) for k, v in params.items()}
        strategy = gsplat_strategy.DefaultStrategy(refine_start_iter=0, refine_every=1, grow_grad2d=0.0, verbose=False)
        strategy.check_sanity(params, optimizers)
        state = strategy.initialize_state(scene_scale=1.0)
        colors, _, info = shim.rasterization(
            params["means"],
            params["quats"],
            params["scales"].exp(),
            torch.sigmoid(params["opacities"]),
            params["colors"],
            p["viewmats"],
            p["Ks"],
            WIDTH,
            HEIGHT,
            near_plane=0.2,
            far_plane=100.0,
            packed=packed,
        )
        strategy.step_pre_backward(params, optimizers, state, 1, info)
        colors.square().mean().backward()
        strategy._update_state(params, state, info, packed=packed)
        assert bool((state["count"] > 0).any())
        grad2d[packed] = state["grad2d"].clone()
        state = strategy.initialize_state(scene_scale=1.0)
        strategy.step_post_backward(params, optimizers, state, 1, info, packed=packed)
        seen = int((grad2d[packed] > 0).sum())
        assert len(params["means"]) == n + seen and all(len(v) == n + seen for v in params.values())
    torch.testing.assert_close(grad2d[False], grad2d[True])


def test_radius_clip_drops_small_gaussians_and_keeps_meta_unclipped():
    """radius_clip: Gaussians whose radius is <= it draw nothing in that camera;
    meta's conics and opacities are still the unclipped projection's."""
    p = _scene()
    p.pop("backgrounds")
    _, alphas, meta = _call(p, packed=False)
    radii = meta["radii"][..., 0]
    clip = float(radii[radii > 0].float().median())
    _, clipped_alphas, clipped_meta = _call(p, packed=False, radius_clip=clip)
    assert float(clipped_alphas.sum()) < float(alphas.sum())
    assert torch.equal(clipped_meta["conics"], meta["conics"]) and torch.equal(
        clipped_meta["opacities"], meta["opacities"]
    )
    _, none_drawn, _ = _call(p, packed=False, radius_clip=1e9)
    assert float(none_drawn.abs().max()) == 0.0


def _device_agreement_case():
    """Two cameras, RGB+ED, and the gradients gsplat's trainers take."""

    def render(p):
        colors, alphas, meta = _call(p, render_mode="RGB+ED")
        return colors, alphas, meta["radii"]

    return _scene(dtype=torch.float32), ("means", "quats", "scales", "opacities", "colors"), render


# CUDA against the CPU where a GPU is (tests/device_agreement.py), and the case itself on the CPU.
test_cuda_tensors_run_on_cuda_and_agree_with_the_cpu, test_the_device_agreement_case_runs_on_the_cpu = agreement_tests(
    _device_agreement_case
)
