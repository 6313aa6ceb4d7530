"""train.pose_opt: camera-pose corrections (splat/pose_opt.py).

* the correction's gradient through a render is the float64 finite
  difference, for surfels (camera by camera and through the sharded
  renderer) and 3D Gaussians;
* the gauge: a joint similarity motion of every camera and the scene leaves
  a render unchanged, and the corrections are kept off it;
* a known perturbation of the train poses is recovered;
* OUT/poses.json is written, read back by render.py's loader, survives a
  resume, and bad files are one-line errors.

Tolerances of the finite-difference checks: torch.autograd.gradcheck with
central differences of step 1e-6 in float64: truncation ~1e-12 x the third
derivative, rounding ~1e-16 / 1e-6 = 1e-10 relative; atol 1e-6 and rtol 1e-5
are those of tests/test_finite_differences.py, where the same renders pass
(a wrong derivative, e.g. a sign or a missing chain-rule factor, is off by
O(1)).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from test_train import make_tiny_scene, teacher_model, tiny_config

import splat
from splat._backend import has_cuda_kernels
from splat.config import ConfigError
from splat.distributed.group import Group
from splat.distributed.sharded_render import Camera, render_sharded
from splat.errors import SplatInputError
from splat.model_render import render_frame
from splat.optimizers import means_lr
from splat.pose_opt import (
    PoseCorrection,
    camera_to_world,
    corrected_viewmat,
    gauge_basis,
    pose_key,
    read_poses,
    skew,
)
from splat.rasterize_3dgs import rasterize_3dgs
from splat.row_adam import RowAdam
from splat.testing import random_gaussians, random_scene

H_STEP, ATOL, RTOL = 1e-6, 1e-6, 1e-5  # see the module doc
RADIUS = 2.5
#: A correction away from zero (the exponential's higher-order terms count there).
XI = torch.tensor([0.02, -0.015, 0.01, 0.01, -0.02, 0.015], dtype=torch.float64)


def _weights(out, seed=1):
    g = torch.Generator().manual_seed(seed)
    names = ("rgb", "alpha", "depth", "normal", "distortion")
    return {
        k: (torch.rand(getattr(out, k).shape, generator=g, dtype=torch.float64) - 0.3).to(getattr(out, k).device)
        for k in names
    }


def _loss(out, w):
    return sum((getattr(out, k) * v).sum() for k, v in w.items())


needs_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and has_cuda_kernels()), reason="needs a GPU and splat built with CUDA kernels"
)
ON = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=needs_gpu)]


@pytest.mark.parametrize("device", ON)
@pytest.mark.parametrize("xi", [torch.zeros(6, dtype=torch.float64), XI], ids=["zero", "nonzero"])
def test_surfel_render_gradient_wrt_the_correction(xi, device):
    s = {k: v.to(device) if torch.is_tensor(v) else v for k, v in random_scene(10, 14, 12, seed=3).items()}
    V, xi = s["viewmat"], xi.to(device)

    def render(x):
        return splat.rasterize(
            s["means"],
            s["quats"],
            s["scales"],
            s["opacities"],
            s["colors"],
            corrected_viewmat(V, x, RADIUS),
            s["K"],
            s["width"],
            s["height"],
            backend=device,
        )

    w = _weights(render(xi))
    assert torch.autograd.gradcheck(
        lambda x: _loss(render(x), w), (xi.clone().requires_grad_(),), eps=H_STEP, atol=ATOL, rtol=RTOL
    )


def test_sharded_surfel_render_gradient_wrt_the_correction():
    """The training path of surfels: every rank's projection of its surfels
    reaches the camera's correction (one process here)."""
    s = random_scene(10, 14, 12, seed=5)

    def loss(x):
        cam = Camera(corrected_viewmat(s["viewmat"], x, RADIUS), s["K"], s["width"], s["height"], None)
        r = render_sharded(
            s["means"], s["quats"], s["scales"], s["opacities"], s["colors"], torch.arange(10), [cam], Group()
        )
        return _loss(r.outputs[0], w) + r.anchor

    cam0 = Camera(s["viewmat"], s["K"], s["width"], s["height"], None)
    out0 = render_sharded(
        s["means"], s["quats"], s["scales"], s["opacities"], s["colors"], torch.arange(10), [cam0], Group()
    ).outputs[0]
    w = _weights(out0, seed=2)
    assert torch.autograd.gradcheck(loss, (XI.clone().requires_grad_(),), eps=H_STEP, atol=ATOL, rtol=RTOL)


def test_gaussian_render_gradient_wrt_the_correction():
    g = random_gaussians(8, seed=4)
    s = random_scene(1, 14, 12, seed=4)

    def render(x):
        return rasterize_3dgs(
            g["means"],
            g["quats"],
            g["scales"],
            g["opacities"],
            g["colors"],
            corrected_viewmat(s["viewmat"], x, RADIUS),
            s["K"],
            s["width"],
            s["height"],
        )

    w = _weights(render(XI), seed=3)
    assert torch.autograd.gradcheck(
        lambda x: _loss(render(x), w), (XI.clone().requires_grad_(),), eps=H_STEP, atol=ATOL, rtol=RTOL
    )


def test_correction_is_the_documented_rigid_motion():
    """exp(0) = the given pose (up to the rounding of t = -R c); otherwise
    R' = Rodrigues(ω) R and c' = c + r u."""
    V = random_scene(1, 8, 8, seed=1)["viewmat"]
    torch.testing.assert_close(corrected_viewmat(V, torch.zeros(6, dtype=V.dtype), RADIUS), V, rtol=0, atol=1e-14)
    w, u = XI[:3], XI[3:]
    th = w.norm()
    k = skew(w / th)
    rodrigues = torch.eye(3, dtype=V.dtype) + math.sin(th) * k + (1 - math.cos(th)) * k @ k
    c2w = camera_to_world(corrected_viewmat(V, XI, RADIUS))
    c2w0 = camera_to_world(V)
    # torch.linalg.matrix_exp's float64 series is accurate to ~1e-11 here (measured 8.9e-12);
    # a wrong sign or axis order is off by ~XI = 1e-2.
    torch.testing.assert_close(c2w[:3, :3], rodrigues @ c2w0[:3, :3], rtol=0, atol=1e-10)
    torch.testing.assert_close(c2w[:3, 3], c2w0[:3, 3] + RADIUS * u, rtol=0, atol=1e-10)  # via that R


# ------------------------------------------------------------------- gauge
def _cameras(n=6, seed=0, dist=3.0):
    """n world -> camera matrices (float64) on an arc looking into the corner
    of :func:`test_train.teacher_model`, at distance 3 to 3.5."""
    from splat.testing import look_at_viewmat

    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        a, e = math.radians(15 + 60 * k / (n - 1)), math.radians(25 + 10 * (k % 3))
        d = dist + 0.5 * float(torch.rand(1, generator=g))
        eye = (d * math.cos(a) * math.cos(e), d * math.sin(a) * math.cos(e), d * math.sin(e))
        out.append(look_at_viewmat(eye, (0.0, 0.0, 0.0), up=(0.0, 0.0, -1.0), dtype=torch.float64))
    return torch.stack(out)


def _similarity(theta, t, s):
    """(rotation G [3, 3], translation, scale) of a world motion."""
    return torch.linalg.matrix_exp(skew(theta)), t, s


def test_joint_motion_of_cameras_and_scene_changes_no_render():
    """The gauge exists: a similarity applied to the scene and every camera
    renders the same images (so the train loss cannot see it)."""
    s = random_scene(12, 16, 14, seed=2)
    G, t, sc = _similarity(
        torch.tensor([0.1, -0.2, 0.05], dtype=torch.float64), torch.tensor([0.3, 0.1, -0.2]).double(), 1.3
    )
    V = s["viewmat"]
    c2w = camera_to_world(V)
    c2w_new = c2w.clone()
    c2w_new[:3, :3] = G @ c2w[:3, :3]
    c2w_new[:3, 3] = sc * (G @ c2w[:3, 3]) + t
    q = s["quats"]  # rotate the surfels: G as a quaternion times q
    from splat.geometry import quat_to_rotmat

    R = G @ quat_to_rotmat(q)
    moved = dict(means=sc * s["means"] @ G.T + t, scales=sc * s["scales"])
    a = splat.rasterize(s["means"], q, s["scales"], s["opacities"], s["colors"], V, s["K"], 16, 14, far=1e3)
    # quaternion of R (well conditioned enough here via torch's eig-free formula)
    from test_train import _rotmat_to_quat

    qn = torch.stack([torch.tensor(_rotmat_to_quat(r.numpy())) for r in R])
    b = splat.rasterize(
        moved["means"],
        qn,
        moved["scales"],
        s["opacities"],
        s["colors"],
        camera_to_world(c2w_new),
        s["K"],
        16,
        14,
        far=1e3,
    )
    torch.testing.assert_close(a.rgb, b.rgb, rtol=0, atol=1e-9)
    torch.testing.assert_close(a.alpha, b.alpha, rtol=0, atol=1e-9)


def test_gauge_basis_is_the_first_order_similarity_motion():
    """Corrections that move every camera by a small similarity lie (to
    first order) in the gauge basis, and fix_gauge removes them."""
    V = _cameras()
    pose = PoseCorrection(V, RADIUS)
    eps = 1e-6
    G, t, sc = _similarity(
        eps * torch.tensor([1.0, -2.0, 0.5]).double(), eps * torch.tensor([2.0, 1.0, -1.0]).double(), 1 + eps
    )
    c2w = camera_to_world(V)
    rows = []
    for m in c2w:
        w = eps * torch.tensor([1.0, -2.0, 0.5]).double()  # the rotation vector of G
        c_new = sc * (G @ m[:3, 3]) + t
        rows.append(torch.cat([w, (c_new - m[:3, 3]) / RADIUS]))
    xi = torch.stack(rows).reshape(-1, 1)  # [6N, 1]
    Q = pose.gauge
    assert Q.shape == (36, 7)
    residual = xi - Q @ (Q.T @ xi)
    assert float(residual.norm()) < 1e-4 * float(xi.norm())  # second-order terms only (eps = 1e-6)


def test_fix_gauge_removes_a_joint_motion_and_keeps_the_rest():
    V = _cameras()
    pose = PoseCorrection(V, RADIUS)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pose.delta.copy_(0.01 * torch.randn(6, 6, generator=g))
    pose.fix_gauge()
    fixed = pose.delta.detach().clone()
    Q = pose.gauge
    assert float((Q.T @ fixed.double().reshape(-1, 1)).abs().max()) < 1e-8
    with torch.no_grad():  # a joint motion of every camera (the gauge) added on top
        pose.delta.add_(
            (Q @ torch.tensor([[0.01], [0.02], [-0.01], [0.03], [0.0], [0.01], [0.02]]).double()).reshape(6, 6).float()
        )
    pose.fix_gauge()
    torch.testing.assert_close(pose.delta.detach(), fixed, rtol=0, atol=1e-8)


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    return make_tiny_scene(tmp_path_factory.mktemp("pose_scene"))


def _train(cfg, out, resume=False, stop_at=None):
    from splat.trainer import Trainer

    class Stop(Exception):
        pass

    def stop(trainer, step, terms):
        if step == stop_at:
            raise Stop()

    trainer = Trainer(cfg, out, resume=resume, callbacks=[stop])
    try:
        trainer.train()
    except Stop:
        pass
    return trainer


@pytest.mark.parametrize("device", ON)
def test_training_holds_the_gauge(scene, tmp_path, monkeypatch, device):
    """After training with pose_opt the corrections have no component along
    the gauge; without fix_gauge they drift along it (the test can fail)."""
    cfg = tiny_config(scene, 30, ["train.pose_opt=true", f"device={device}"])
    t = _train(cfg, tmp_path / "held")
    Q, x = t.pose.gauge.cpu(), t.pose.delta.detach().cpu().double().reshape(-1, 1)
    assert float(x.abs().max()) > 1e-3  # the corrections moved
    assert float((Q.T @ x).abs().max()) < 1e-7
    monkeypatch.setattr(PoseCorrection, "fix_gauge", lambda self: None)
    t = _train(cfg, tmp_path / "free")
    x = t.pose.delta.detach().cpu().double().reshape(-1, 1)
    assert float((Q.T @ x).abs().max()) > 1e-4


def test_corrections_start_at_pose_opt_from(scene, tmp_path):
    """Before ``train.pose_opt_from`` the corrections stay exactly zero (the
    step renders the given poses), from it they move; a start at or past the
    last step is a one-line config error naming the key."""
    t = _train(tiny_config(scene, 30, ["train.pose_opt=true", "train.pose_opt_from=20"]), tmp_path / "late", stop_at=19)
    assert torch.equal(t.pose.delta.detach(), torch.zeros_like(t.pose.delta))
    t = _train(tiny_config(scene, 30, ["train.pose_opt=true", "train.pose_opt_from=20"]), tmp_path / "whole")
    assert float(t.pose.delta.detach().abs().max()) > 1e-4
    with pytest.raises(ConfigError, match=r"train.pose_opt_from: 30 is not before the last step"):
        tiny_config(scene, 30, ["train.pose_opt=true", "train.pose_opt_from=30"])


def _reprojection_px(viewmats, truth, points, K):
    """Mean pixel distance between ``points`` [M, 3] seen by ``viewmats`` and by ``truth`` [N, 4, 4]."""

    def pixels(v):
        cam = points @ v[:3, :3].T + v[:3, 3]  # [M, 3]
        uv = cam @ K.T
        return uv[:, :2] / uv[:, 2:]

    return float(torch.stack([(pixels(a) - pixels(b)).norm(dim=1).mean() for a, b in zip(viewmats, truth)]).mean())


def test_known_perturbation_is_recovered():
    """The teacher scene held fixed, six train cameras perturbed by a
    gauge-free 1.5 deg turn and a shift of 3 % of their distance: 20 epochs of
    the corrections alone (RowAdam, the training's decaying learning
    rate) bring the scene's reprojection error from 1.41 px to 0.15 px
    (asserted: below 1/5 of the start).  The
    rotation error falls less (1.4 -> 0.8 deg): at 48 pixels a turn and a
    sideways shift that move the image alike are told apart by
    sub-pixel parallax only, which is what the reprojection error measures."""
    teacher = teacher_model()
    V = _cameras(6)
    size, f = 48, 43.0
    K = torch.tensor([[f, 0, size / 2], [0, f, size / 2], [0, 0, 1.0]])
    with torch.no_grad():
        targets = [render_frame(teacher, Camera(v.float(), K, size, size, None), torch.ones(3)).rgb for v in V]
    g = torch.Generator().manual_seed(3)
    true = torch.randn(6, 6, generator=g, dtype=torch.float64)
    true[:, :3] *= math.radians(1.5) / true[:, :3].norm(dim=1, keepdim=True)
    true[:, 3:] *= 0.03 * 3.2 / RADIUS / true[:, 3:].norm(dim=1, keepdim=True)
    Q = gauge_basis(camera_to_world(V)[:, :3, 3], RADIUS)
    true = (true.reshape(-1, 1) - Q @ (Q.T @ true.reshape(-1, 1))).reshape(6, 6)
    perturbed = torch.stack([corrected_viewmat(v, x, RADIUS) for v, x in zip(V, true)])
    pose = PoseCorrection(perturbed, RADIUS)
    opt = RowAdam(list(pose.parameters()), lr=1e-2)
    points = teacher.means.detach().double()

    def errors():
        vm = pose.viewmats(perturbed)
        c = ((vm[:, :3, :3] @ V[:, :3, :3].transpose(1, 2)).diagonal(dim1=1, dim2=2).sum(1) - 1) / 2
        return _reprojection_px(vm, V, points, K.double()), float(torch.rad2deg(torch.acos(c.clamp(-1, 1))).mean())

    (px0, rot0), epochs = errors(), 20
    for epoch in range(epochs):
        opt.param_groups[0]["lr"] = means_lr(epoch, epochs, 1e-2, 1e-4)  # as BatchStep decays train.pose_opt_lr
        for i in range(len(V)):
            out = render_frame(
                teacher, Camera(pose.viewmat(i, perturbed[i].float()), K, size, size, None), torch.ones(3)
            )
            (out.rgb - targets[i]).square().mean().backward()
            opt.step()
            opt.zero_grad()
            pose.fix_gauge()
    px, rot = errors()
    assert px0 > 1.0 and px < px0 / 5 and rot < rot0 / 1.5, (px0, px, rot0, rot)


# ------------------------------------------------------------- poses.json
def test_poses_json_written_resumed_and_read_by_render(scene, tmp_path):
    from splat.render_files import render_split
    from splat.trained_run import load_run

    cfg = tiny_config(scene, 30, ["train.pose_opt=true", "checkpoint.every=10"])
    whole = _train(cfg, tmp_path / "whole")
    stopped = tmp_path / "stopped"
    _train(cfg, stopped, stop_at=15)  # checkpoint at 10: steps 11-15 are replayed
    resumed = _train(cfg, stopped, resume=True)
    assert torch.equal(resumed.pose.delta, whole.pose.delta)
    assert (tmp_path / "whole" / "poses.json").read_bytes() == (stopped / "poses.json").read_bytes()

    body = json.loads((tmp_path / "whole" / "poses.json").read_text())
    train = whole.scene.train
    assert sorted(body) == sorted(f"images/{f.stem}.png" for f in train)
    optimised = whole.pose.viewmats(torch.stack([f.viewmat.double() for f in train]))
    _, _, loaded = load_run(tmp_path / "whole")
    for f, v in zip(loaded.train, optimised):
        torch.testing.assert_close(f.viewmat.double(), v, rtol=0, atol=1e-6)
        assert not torch.allclose(f.viewmat.double(), next(g for g in train if g.stem == f.stem).viewmat.double())
    for f, g in zip(loaded.test, whole.scene.test):
        assert torch.equal(f.viewmat, g.viewmat)  # test cameras as given
    render_split(tmp_path / "whole", None, "train", (), False)
    assert len(list((tmp_path / "whole").rglob("*.png"))) >= len(train)


def test_bad_poses_json_is_one_line_error(scene, tmp_path):
    from splat.data import load_scene

    frames = load_scene(scene, test_every=5).train
    p = tmp_path / "poses.json"
    p.write_text("{not json")
    with pytest.raises(SplatInputError, match="poses.json: cannot read"):
        read_poses(p, frames, scene)
    p.write_text(json.dumps({pose_key(frames[0], scene): [[1, 0, 0, 0]] * 4}))
    with pytest.raises(SplatInputError, match="not a rigid"):
        read_poses(p, frames, scene)
    p.write_text("{}")
    with pytest.raises(SplatInputError, match="no 4x4 pose for train image 'images/view_001.png'"):
        read_poses(p, frames, scene)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
