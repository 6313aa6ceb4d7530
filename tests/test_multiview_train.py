"""``loss.multiview`` in training steps (issue 41): the terms are logged and
reach the parameters on both rendering paths, lonely cameras are named once,
photos are compared under no appearance correction, and with pose
optimisation the terms use the corrected poses.  The tiny scene of tests/test_train.py;
several processes: tests/test_distributed_train.py."""

from __future__ import annotations

import types

import pytest
import torch
from test_batch import _grads_of_one_step
from test_train import tiny_config, tiny_scene  # noqa: F401 (fixture)

from splat.appearance import AffineAppearance
from splat.multiview import grey
from splat.trainer import Trainer
from splat.training.capability import check_distributed
from splat.training.multiview_step import MultiViewTerms

#: PGSR's settings of the terms (default.yaml's are cheaper: every other step, a half-size neighbour).
PGSR = ["loss.multiview.every=1", "loss.multiview.neighbour_downscale=1", "loss.multiview.geo_pixels=0"]
#: The multi-view terms from step 1, neighbours within 90 deg so that every tiny-scene camera has some.
MV_ON = ["loss.multiview.enabled=true", "loss.multiview.start=0", "loss.multiview.max_angle=90", *PGSR]


@pytest.mark.parametrize(
    "primitive, backend", [("2dgs", "auto"), ("2dgs", "torch"), ("3dgs", "auto")]
)  # surfels sharded (one process) / camera by camera; 3D Gaussians camera by camera
def test_a_step_logs_the_terms_and_they_reach_the_parameters(tiny_scene, tmp_path, primitive, backend):  # noqa: F811
    extra = [f"model.primitive={primitive}", f"render.backend={backend}", "loss.dist_from=0", "loss.normal_from=0"]
    on = Trainer(tiny_config(tiny_scene, 10, extra + MV_ON), tmp_path / "on")
    assert all(on.batch_step.multiview.neighbours)
    terms = on.train_step(1)
    assert terms["mv_geo"] >= 0 and 0 < terms["mv_ncc"] < 1
    off = Trainer(tiny_config(tiny_scene, 10, extra), tmp_path / "off")
    g_on, g_off = _grads_of_one_step(on, 2), _grads_of_one_step(off, 2)
    assert all(torch.isfinite(g).all() for g in g_on.values())
    # Same model and views: the multi-view terms change the means' gradient.
    assert not torch.allclose(g_on["means"], g_off["means"])


CHEAP = ["loss.multiview.neighbour_downscale=2", "loss.multiview.geo_pixels=200"]


@pytest.mark.parametrize("cheap", [False, True], ids=["pgsr", "half_size_neighbour_pixel_subset"])
def test_both_rendering_paths_give_the_same_multiview_gradient(tiny_scene, tmp_path, monkeypatch, cheap):  # noqa: F811
    """Surfels, one process: sharded rendering (partners rendered after the
    batch in one call) against camera by camera (render.backend=torch, the
    PyTorch reference rasterizer).  Float32 renders by two implementations:
    the gradients agree to 1e-3 of their largest entry (a partner swapped
    or left out moves them by far more).  ``cheap``: the partner at half
    size (a batch of two sizes in one sharded call) and the geometric term
    on 200 pixels."""
    sizes = []
    original = MultiViewTerms.loss

    def loss(self, out, partner_out, *a, **k):
        sizes.append((tuple(out.depth.shape), tuple(partner_out.depth.shape)))
        return original(self, out, partner_out, *a, **k)

    monkeypatch.setattr(MultiViewTerms, "loss", loss)
    grads = {}
    for backend in ("auto", "torch"):
        extra = [f"render.backend={backend}"] + MV_ON + (CHEAP if cheap else [])
        t = Trainer(tiny_config(tiny_scene, 10, extra), tmp_path / backend)
        grads[backend] = _grads_of_one_step(t, 1)
    (h, w), (ph, pw) = sizes[0]
    assert len(set(sizes)) == 1 and (ph, pw) == ((h // 2, w // 2) if cheap else (h, w))
    for name, g in grads["auto"].items():
        scale = float(g.abs().max())
        assert torch.allclose(grads["torch"][name], g, rtol=0, atol=1e-3 * scale), name


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])  # sharded / camera by camera
def test_a_neighbour_without_gradient_renders_forward_only(tiny_scene, tmp_path, monkeypatch, primitive):  # noqa: F811
    """``loss.multiview.neighbour_gradient=false``: the same terms, but the
    partner's render is left out of the backward (one raster backward a
    step instead of two), and the gradient differs by the partner's share."""
    import importlib

    calls = []
    for name in ("splat.rasterize", "splat.rasterize_3dgs"):
        module = importlib.import_module(name)  # (splat.rasterize the function shadows the module)
        original = module.raster_backward
        monkeypatch.setattr(module, "raster_backward", lambda *a, _f=original: calls.append(1) or _f(*a))
    terms, grads, backwards = {}, {}, {}
    for flag in ("true", "false"):
        extra = [f"model.primitive={primitive}", f"loss.multiview.neighbour_gradient={flag}"]
        terms[flag] = Trainer(tiny_config(tiny_scene, 10, MV_ON + extra), tmp_path / f"a{flag}").train_step(1)
        calls.clear()
        grads[flag] = _grads_of_one_step(Trainer(tiny_config(tiny_scene, 10, MV_ON + extra), tmp_path / flag), 1)
        backwards[flag] = len(calls)
    assert backwards == {"true": 2, "false": 1}
    for k in ("mv_geo", "mv_ncc", "loss"):
        assert terms["false"][k] == terms["true"][k], k  # the forward is the same graph
    assert not torch.allclose(grads["true"]["means"], grads["false"]["means"])


def test_cameras_without_neighbours_are_named_in_one_line(tiny_scene, tmp_path, capsys):  # noqa: F811
    Trainer(tiny_config(tiny_scene, 10, MV_ON + ["loss.multiview.max_angle=0.001"]), tmp_path / "run")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("loss.multiview")]
    assert len(lines) == 1 and "no neighbour" in lines[0]


def test_photos_are_compared_without_their_appearance_correction():
    g = torch.Generator().manual_seed(0)
    scene = torch.rand(6, 5, 3, generator=g)
    A = torch.tensor([[1.3, 0.1, 0.0], [0.0, 0.8, 0.05], [0.02, 0.0, 1.1]])
    b = torch.tensor([0.05, -0.02, 0.03])
    frames = [
        types.SimpleNamespace(image=scene @ A.T + b, viewmat=torch.eye(4), stem="a"),
        types.SimpleNamespace(image=scene, viewmat=torch.eye(4), stem="b"),
    ]
    appearance = AffineAppearance(2)
    with torch.no_grad():
        appearance.matrix[0] = A.reshape(9)
        appearance.offset[0] = b
    mv = MultiViewTerms(tiny_config_multiview(), frames, 1.0, 0, announce=False)
    assert torch.allclose(mv.canonical_grey(frames[0], 0, appearance, "cpu"), grey(scene), atol=1e-6)
    assert torch.allclose(mv.canonical_grey(frames[1], 1, appearance, "cpu"), grey(scene), atol=1e-6)
    assert not torch.allclose(mv.canonical_grey(frames[0], 0, None, "cpu"), grey(scene), atol=1e-2)


def tiny_config_multiview() -> dict:
    from splat.config import DEFAULT_CONFIG

    return dict(DEFAULT_CONFIG["loss"]["multiview"], enabled=True, every=1, neighbour_downscale=1, geo_pixels=0)


def test_several_processes_accept_the_terms(tiny_scene):  # noqa: F811
    check_distributed(tiny_config(tiny_scene, 10, MV_ON))  # no error: partners render on their camera's rank


@pytest.mark.parametrize(
    "backend",
    [
        "auto",
        "torch",
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")),
    ],
)  # sharded / camera by camera / the CUDA kernels (the GPU campaign runs it)
def test_with_pose_optimisation_the_terms_use_the_corrected_poses(tiny_scene, tmp_path, monkeypatch, backend):  # noqa: F811
    """train.pose_opt: both cameras of a pair are rendered from, and the
    terms' homographies use, the poses as corrected this step (constants to
    the terms: the pose gradient comes from the photometric loss)."""
    seen = []
    original = MultiViewTerms.loss

    def loss(self, out, partner_out, frames, index, partner, viewmats, *a, **k):
        seen.append((index, partner, [v.clone() for v in viewmats], [v.requires_grad for v in viewmats]))
        return original(self, out, partner_out, frames, index, partner, viewmats, *a, **k)

    monkeypatch.setattr(MultiViewTerms, "loss", loss)
    device = ["device=cuda"] if backend == "cuda" else [f"render.backend={backend}"]
    extra = MV_ON + ["train.pose_opt=true", "train.pose_opt_from=1"] + device
    t = Trainer(tiny_config(tiny_scene, 10, extra), tmp_path / "run")
    with torch.no_grad():  # a correction on every camera, as after some training
        t.pose.delta.copy_(0.02 * torch.randn(t.pose.delta.shape, generator=torch.Generator().manual_seed(0)))
        frames = t.scene.train
        corrected = [t.pose.viewmat(i, f.viewmat) for i, f in enumerate(frames)]  # before the step moves them
    terms = t.train_step(1)
    assert terms["mv_geo"] >= 0 and 0 < terms["mv_ncc"] < 1
    index, partner, (ref, nb), needs_grad = seen[0]
    ref, nb = ref.cpu(), nb.cpu()
    corrected = [v.cpu() for v in corrected]
    assert torch.allclose(ref, corrected[index], atol=1e-6) and torch.allclose(nb, corrected[partner], atol=1e-6)
    assert not torch.allclose(nb, frames[partner].viewmat.cpu(), atol=1e-4)  # not the given pose
    assert needs_grad[1] is False
    g = _grads_of_one_step(t, 2)
    assert all(torch.isfinite(v).all() for v in g.values())
    assert float(t.pose.delta.grad.abs().sum()) > 0  # the photometric loss still reaches the corrections


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("cheap", [False, True], ids=["pgsr", "cheap"])
@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_a_step_on_cuda_logs_the_terms(tiny_scene, tmp_path, primitive, cheap):  # noqa: F811
    extra = ["device=cuda", f"model.primitive={primitive}"] + (
        CHEAP + ["loss.multiview.neighbour_gradient=false"]
    ) * cheap
    t = Trainer(tiny_config(tiny_scene, 10, MV_ON + extra), tmp_path / "run")
    terms = t.train_step(1)
    assert terms["mv_geo"] >= 0 and 0 < terms["mv_ncc"] < 1


def test_the_terms_run_from_start_on_every_nth_step():
    cfg = dict(tiny_config_multiview(), start=10, every=3)
    frames = [types.SimpleNamespace(viewmat=torch.eye(4), stem="a")]
    mv = MultiViewTerms(cfg, frames, 1.0, 0, announce=False)
    assert [s for s in range(1, 20) if mv.active(s)] == [10, 13, 16, 19]
    assert not MultiViewTerms(dict(cfg, enabled=False), frames, 1.0, 0, announce=False).active(10)
