"""bench/mesh_masked.py: the visual hull of the masks that picks the SfM
points and mesh samples it compares, and the nearest-point distances (the
meshing and the scores are bench/mesh.py's, tested in tests/test_mesh_metrics.py)."""

from __future__ import annotations

import runpy
import types
from pathlib import Path

import numpy as np
import torch

from splat.testing import intrinsics, look_at_viewmat

ROOT = Path(__file__).resolve().parents[1]
bench = runpy.run_path(str(ROOT / "bench" / "mesh_masked.py"))


def _frame(eye, mask):
    V = look_at_viewmat(eye, (0.0, 0.0, 0.0), dtype=torch.float64)
    return types.SimpleNamespace(viewmat=V, K=intrinsics(40, 30, 40.0).double(), object_mask=mask)


def test_a_point_is_inside_when_every_view_that_sees_it_masks_it():
    left = torch.zeros(30, 40)
    left[:, :20] = 1.0  # camera 1 masks the left half of its image
    full = torch.ones(30, 40)
    frames = [_frame((0.0, 0.0, -4.0), left), _frame((0.0, 0.0, 4.0), full)]
    # Image x grows with camera 1's +x; the point on its optical axis lands on the column boundary.
    K = frames[0].K.numpy()
    V = frames[0].viewmat.numpy()
    pts = np.array([[-0.3, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0, 0.0, -10.0], [50.0, 0.0, 0.0]])
    X = pts @ V[:3, :3].T + V[:3, 3]
    u = K[0, 0] * X[:, 0] / X[:, 2] + K[0, 2]
    got = bench["inside_masks"](pts, frames)
    on_left = u[0] < 20
    # The two near points: inside exactly where camera 1's mask is 1 (camera 2 masks everything);
    # the point behind camera 1 is seen only by camera 2 (inside); the far one by no view (outside).
    assert got[0] == on_left and got[1] == (not on_left)
    assert got[2] and not got[3]


def test_nearest_distances_match_a_brute_force_minimum():
    g = np.random.default_rng(0)
    q, p = g.normal(size=(5000, 3)), g.normal(size=(300, 3))
    expect = np.sqrt(((q[:, None] - p[None]) ** 2).sum(-1)).min(1)
    assert np.allclose(bench["nearest_distances"](q, p, chunk=777), expect, rtol=0, atol=1e-12)
