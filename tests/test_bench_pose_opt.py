"""bench/pose_opt.py: the perturbation, its split into a gauge part and the
rest, and the pose errors it reports (the training runs themselves are the
benchmark, not tested here)."""

from __future__ import annotations

import math
import runpy
from pathlib import Path

import torch

from splat.pose_opt import gauge_basis, skew
from splat.testing import look_at_viewmat

ROOT = Path(__file__).resolve().parents[1]
bench = runpy.run_path(str(ROOT / "bench" / "pose_opt.py"))
RADIUS = 2.0


def _exact(n=24) -> torch.Tensor:
    """[n, 4, 4] camera -> world on a ring around the origin, looking at it."""
    out = []
    for k in range(n):
        a = 2 * math.pi * k / n
        eye = (4 * math.cos(a), 4 * math.sin(a), 1.0 + 0.3 * math.sin(3 * a))
        V = look_at_viewmat(eye, (0.0, 0.0, 0.0), up=(0.0, 0.0, -1.0), dtype=torch.float64)
        out.append(torch.linalg.inv(V))
    return torch.stack(out)


def test_perturbation_has_the_asked_size():
    exact = _exact()
    given = bench["perturb"](exact, 1.0, 0.01, seed=0)
    err = bench["pose_errors"](given, exact)["raw"]
    assert abs(err["rot_deg_mean"] - 1.0) < 1e-3 and abs(err["pos_pct_mean"] - 1.0) < 1e-3


def test_rotation_vector_inverts_the_exponential():
    w = torch.tensor([[0.1, 0.2, -0.3], [1e-3, 0.0, 2e-3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(bench["rotation_vector"](torch.linalg.matrix_exp(skew(w))), w, rtol=0, atol=1e-12)


def test_split_gauge_parts_add_up_and_only_the_rest_is_seen():
    """The gauge part is a joint similarity motion: after the best similarity
    it leaves no error (to first order, the perturbation is small); the rest
    has no component along the gauge; together they are the perturbation."""
    exact = _exact()
    given = bench["perturb"](exact, 1.0, 0.01, seed=3)
    gauge = bench["split_gauge"](given, exact, RADIUS, "gauge")
    rest = bench["split_gauge"](given, exact, RADIUS, "rest")
    g_err = bench["pose_errors"](gauge, exact)
    assert g_err["raw"]["rot_deg_mean"] > 0.05  # 24 cameras: about 1/sqrt(24) of a camera's error
    assert g_err["aligned"]["rot_deg_mean"] < 1e-3 and g_err["aligned"]["pos_pct_mean"] < 1e-2

    def xi(c2w):
        omega = bench["rotation_vector"](c2w[:, :3, :3] @ exact[:, :3, :3].transpose(1, 2))
        return torch.cat([omega, (c2w[:, :3, 3] - exact[:, :3, 3]) / RADIUS], 1).reshape(-1, 1)

    Q = gauge_basis(exact[:, :3, 3], RADIUS)
    assert float((Q.T @ xi(rest)).abs().max()) < 1e-12
    torch.testing.assert_close(xi(gauge) + xi(rest), xi(given), rtol=0, atol=1e-12)


def test_test_time_refinement_brings_a_turned_test_camera_back(tmp_path):
    """``--refine-test``: a test camera whose photo is the model's own render
    at its exact pose, given turned by 0.5 deg and shifted by 1 % of a
    scene radius: the refined pose ends nearer the exact one (rotation
    error cut at least threefold) and the render closer to the photo."""
    from test_train import make_tiny_scene, tiny_config

    from splat.model_render import render_frame
    from splat.pose_opt import corrected_viewmat
    from splat.trainer import Trainer

    trainer = Trainer(tiny_config(make_tiny_scene(tmp_path / "scene"), 60), tmp_path / "run")
    trainer.train()
    scene = trainer.scene
    frame = scene.test[0]
    with torch.no_grad():
        frame.image = render_frame(trainer.model, frame, trainer.background).rgb.clamp(0, 1)
        frame.mask = None
    exact = frame.viewmat.double().clone()
    xi = torch.tensor([0.0, math.radians(0.5), 0.0, 0.01, 0.0, 0.0], dtype=torch.float64)
    frame.viewmat = corrected_viewmat(exact, xi, float(scene.scene_radius())).float()
    scene.test = [frame]
    refined = bench["refined_test_frames"](trainer, scene, 150, 2e-3)[0]

    def turn_deg(V):
        R = V[:3, :3].double() @ exact[:3, :3].T
        return math.degrees(math.acos(max(-1.0, min(1.0, (float(torch.trace(R)) - 1) / 2))))

    assert turn_deg(frame.viewmat) > 0.45 and turn_deg(refined.viewmat) < turn_deg(frame.viewmat) / 3
    assert bench["test_psnr_of"](trainer, [refined]) > bench["test_psnr_of"](trainer, [frame]) + 3
    assert all(p.requires_grad for p in trainer.model.params.values())  # the model is left trainable
