"""bench/depth_floor.py: rays through a pixel's area into a mesh, and the error they score."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
floor = runpy.run_path(str(ROOT / "bench" / "depth_floor.py"))


def test_offsets_are_the_cell_centres_of_a_pixel():
    o = floor["subpixel_offsets"](2)
    assert o.tolist() == [[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]]


def test_a_pixel_on_an_edge_sees_both_surfaces_and_its_centre_one():
    """A square at z = 2 covering x < 0 in front of a camera at the origin (identity pose), its edge
    x = 0 through the middle of pixel column 2: that column's left rays hit z = 2 and its right ones
    miss, the columns left of it hit with every ray, the one right of it with none; a pixel the rays
    all miss scores as depth 0."""
    o3d = pytest.importorskip("open3d")
    v = torch.tensor([[-4.0, -4, 2], [0, -4, 2], [0, 4, 2], [-4, 4, 2]])
    mesh = o3d.t.geometry.TriangleMesh()
    mesh.vertex.positions = o3d.core.Tensor(v.numpy())
    mesh.triangle.indices = o3d.core.Tensor(torch.tensor([[0, 1, 2], [0, 2, 3]], dtype=torch.int32).numpy())
    scene = o3d.t.geometry.RaycastingScene()
    scene.add_triangles(mesh)
    W = H = 4
    K = torch.tensor([[4.0, 0, 2.5], [0, 4.0, 2.0], [0, 0, 1]])  # x = 0 at u = 2.5
    z = floor["cast_depths"](scene, torch.eye(4), K, H, W, floor["subpixel_offsets"](2))  # [H, W, 4]
    assert torch.allclose(z[:, :2], torch.full_like(z[:, :2], 2.0), atol=1e-5)  # float32 rays
    left, right = [0, 2], [1, 3]  # the offsets at u + 0.25 and u + 0.75
    assert torch.allclose(z[:, 2, left], torch.full((H, 2), 2.0, dtype=z.dtype), atol=1e-5)
    assert torch.isinf(z[:, 2, right]).all() and torch.isinf(z[:, 3]).all()
    gt = torch.full((H, W), 2.0, dtype=torch.float64)
    pick = torch.zeros(H, W, dtype=torch.bool)
    pick[:, 3] = True  # missed everywhere: rendered depth 0, error |0 - 2| / 2 = 1 per pixel
    assert floor["relative_error"](z.mean(-1), gt, pick) == pytest.approx(H)
