"""3D Gaussians in the model, the PLY files, the renderer and the trainer
(``model.primitive=3dgs``, issue 22)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_train import tiny_config, tiny_scene  # noqa: F401 (fixture)

from splat.errors import SplatInputError
from splat.geometry import quat_to_rotmat
from splat.model import create_from_points
from splat.model_render import render_frame
from splat.ply import PLY_THIN_FACTOR, load_ply, ply_attribute_names, save_ply
from splat.trainer import Trainer


def _model(primitive, n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 3, generator=g) * 2 - 1
    return create_from_points(pts, torch.rand(n, 3, generator=g), sh_degree=1, generator=g, primitive=primitive)


def test_create_from_points_gives_three_isotropic_scales():
    m = _model("3dgs")
    assert m.primitive == "3dgs" and m.scales.shape == (50, 3)
    assert torch.equal(m.scales[:, 0], m.scales[:, 2])
    assert _model("2dgs").scales.shape == (50, 2)
    with pytest.raises(ValueError, match="primitive"):
        _model("4dgs")


def test_normals_of_3d_gaussians_are_their_shortest_axis():
    m = _model("3dgs", n=4)
    with torch.no_grad():
        m.params["scales"][:] = torch.log(
            torch.tensor([[0.3, 0.01, 0.2], [0.01, 0.2, 0.3], [0.2, 0.3, 0.01], [0.3, 0.2, 0.01]])
        )
    rot = quat_to_rotmat(m.params["quats"].detach())
    expected = torch.stack([rot[0, :, 1], rot[1, :, 0], rot[2, :, 2], rot[3, :, 2]])
    assert torch.allclose(m.normals().detach(), expected)


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_ply_round_trip_keeps_the_primitive(tmp_path, primitive):
    m = _model(primitive)
    save_ply(m, tmp_path / "m.ply")
    back = load_ply(tmp_path / "m.ply")
    assert back.primitive == primitive
    for k, v in m.params.items():
        assert torch.equal(back.params[k], v.detach()), k
    from plyfile import PlyData

    assert f"splat primitive {primitive}" in PlyData.read(str(tmp_path / "m.ply")).comments


def _write_inria_ply(path, scales):
    """A PLY as INRIA's 3DGS writes it: no splat comment, three scales."""
    from plyfile import PlyData, PlyElement

    n = len(scales)
    names = ply_attribute_names(0)
    arr = np.zeros(n, dtype=[(name, "f4") for name in names])
    rng = np.random.default_rng(0)
    for name in ("x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"):
        arr[name] = rng.normal(size=n)
    arr["rot_0"] = 1.0
    for i in range(3):
        arr[f"scale_{i}"] = scales[:, i]
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(path))


def test_plys_without_a_comment_are_read_by_their_scales(tmp_path):
    """INRIA 3DGS files load as 3D Gaussians; splat's surfel files from before
    the comment (scale_2 the thin axis) still load as surfels."""
    rng = np.random.default_rng(1)
    s = np.log(rng.uniform(0.01, 0.2, size=(20, 3))).astype(np.float32)
    _write_inria_ply(tmp_path / "inria.ply", s)
    m = load_ply(tmp_path / "inria.ply")
    assert m.primitive == "3dgs" and np.allclose(m.params["scales"].detach().numpy(), s)
    thin = s.copy()
    thin[:, 2] = np.minimum(s[:, 0], s[:, 1]) + np.float32(math.log(PLY_THIN_FACTOR))
    _write_inria_ply(tmp_path / "old_splat.ply", thin)
    assert load_ply(tmp_path / "old_splat.ply").primitive == "2dgs"
    assert load_ply(tmp_path / "inria.ply", primitive="2dgs").scales.shape == (20, 2)


def test_a_bad_primitive_comment_is_a_one_line_error(tmp_path):
    from plyfile import PlyData

    save_ply(_model("3dgs"), tmp_path / "m.ply")
    ply = PlyData.read(str(tmp_path / "m.ply"))
    ply.comments = ["splat primitive 5dgs"]
    ply.write(str(tmp_path / "bad.ply"))
    with pytest.raises(SplatInputError, match="names primitive '5dgs'"):
        load_ply(tmp_path / "bad.ply")


def test_training_3d_gaussians_improves_test_psnr(tiny_scene, tmp_path):  # noqa: F811
    """60 steps with densification (3D splits) and both regularisers: test
    PSNR rises by >= 3 dB (observed ~+7 dB), depth and normal renders are
    finite, and the PLY holds three scales.  (Kill and resume:
    test_train.py's resume test, with model.primitive=3dgs.)"""
    cfg = tiny_config(tiny_scene, 60, ["model.primitive=3dgs", "checkpoint.every=30"])
    trainer = Trainer(cfg, tmp_path / "run")
    before = trainer.evaluate()["test.psnr"]
    m = trainer.train()
    assert m["test.psnr"] >= before + 3.0, (before, m["test.psnr"])
    model = load_ply(tmp_path / "run" / "point_cloud.ply")
    assert model.primitive == "3dgs" and model.num_gaussians == m["n_gaussians"]
    out = render_frame(model, trainer.scene.test[0], torch.ones(3))
    assert (
        torch.isfinite(out.depth).all() and torch.isfinite(out.normal).all() and float(out.alpha.detach().max()) > 0.5
    )
    assert m["n_gaussians"] != 0 and np.isfinite(m["test.depth_rel_err"])


def test_the_viewer_loads_and_renders_a_ply_trained_by_inria(tmp_path):
    """view.py's loading and rendering path on an INRIA 3DGS PLY (no splat
    comment, three scales): 3D Gaussians, drawn from the start view."""
    from splat.testing import rotmat_to_quat
    from splat.viewer.camera import camera_from_view
    from splat.viewer.load import load_for_viewer
    from splat.viewer.server import ViewerServer

    rng = np.random.default_rng(2)
    scales = np.log(rng.uniform(0.05, 0.2, size=(30, 3))).astype(np.float32)
    _write_inria_ply(tmp_path / "inria.ply", scales)
    inp = load_for_viewer(tmp_path / "inria.ply")
    assert inp.model.primitive == "3dgs"
    start = inp.start
    forward = (start.look_at - start.position) / np.linalg.norm(start.look_at - start.position)
    right = np.cross(forward, start.up)
    R = np.stack([right, -start.up, forward], axis=1)  # camera -> world columns: x right, y down, z forward
    wxyz = rotmat_to_quat(torch.from_numpy(R)[None])[0].numpy()
    camera = camera_from_view(wxyz, start.position, start.fov_y, 48, 36)
    out, n = ViewerServer.render(_FakeServer(inp.model), camera)
    assert n == 30 and float(out.alpha.max()) > 0.1 and torch.isfinite(out.depth).all()


class _FakeServer:
    """The few attributes ViewerServer.render reads (no viser server started)."""

    def __init__(self, model):
        import threading
        from types import SimpleNamespace

        self._model, self._model_lock, self.backend = model, threading.Lock(), "auto"
        self.ui = SimpleNamespace(
            bg=SimpleNamespace(value=(255, 255, 255)),
            near=SimpleNamespace(value=0.01),
            far=SimpleNamespace(value=100.0),
        )


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_a_model_without_primitives_saves_and_loads(tmp_path, primitive):
    """Densification can prune everything: the final PLY must still be written."""
    from splat.model import GaussianModel

    m = _model(primitive)
    empty = GaussianModel({k: v.detach()[:0] for k, v in m.params.items()}, m.sh_degree)
    save_ply(empty, tmp_path / "e.ply")
    back = load_ply(tmp_path / "e.ply")
    assert back.num_gaussians == 0 and back.primitive == primitive and back.sh_degree == m.sh_degree
