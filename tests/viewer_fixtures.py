"""A tiny hand-built model for the viewer tests, in a training-output folder
whose config points at the bundled sample scene (so the viewer starts at its
first test camera)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample_scene"


def first_test_camera():
    """(viewmat [4,4] float64, K [3,3] float64, width, height) of the sample scene's first test view."""
    from splat.config import load_config
    from splat.data import load_scene_from_config

    cfg = load_config(str(ROOT / "configs" / "fast.yaml"), [f"data.path={SAMPLE}"])
    f = load_scene_from_config(cfg["data"]).test[0]
    return f.viewmat.double(), f.K.double(), f.width, f.height


def tilted_wall(
    viewmat: torch.Tensor, nx: int = 14, ny: int = 10, depth: float = 3.0, tilt: float = 0.35, sigma_scale: float = 1.1
):
    """A GaussianModel: an ``nx`` x ``ny`` grid of opaque, differently coloured
    surfels on a plane in front of ``viewmat``'s camera, whose depth grows to
    the right (camera z = depth * (1 + tilt * x / half width)).  Standard
    deviation ``sigma_scale`` x half the grid spacing: 1.1 overlaps them into a
    smooth wall, 0.45 leaves separate dots with sharp edges."""
    from splat.model import GaussianModel, logit
    from splat.sh import rgb_to_sh
    from splat.testing import quats_from_normals

    half_w, half_h = 0.5 * depth, 0.35 * depth
    u = torch.linspace(-1, 1, nx, dtype=torch.float64)
    v = torch.linspace(-1, 1, ny, dtype=torch.float64)
    gv, gu = torch.meshgrid(v, u, indexing="ij")
    x, y = gu.reshape(-1) * half_w, gv.reshape(-1) * half_h
    z = depth * (1 + tilt * x / half_w)
    cam = torch.stack([x, y, z], 1)  # [N, 3]
    slope = depth * tilt / half_w  # dz/dx
    n_cam = torch.tensor([slope, 0.0, -1.0], dtype=torch.float64)
    n_cam = (n_cam / n_cam.norm()).expand(len(cam), 3)
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    means = (cam - t) @ R  # R^T (p - t)
    normals = n_cam @ R
    rgb = torch.stack(
        [
            0.5 + 0.45 * torch.cos(3 * gu.reshape(-1)),
            0.5 + 0.45 * torch.sin(4 * gv.reshape(-1)),
            0.5 + 0.45 * torch.cos(5 * (gu + gv).reshape(-1) + 1.0),
        ],
        1,
    )
    sigma = sigma_scale * (2 * half_w / (nx - 1)) / 2
    n = len(cam)
    params = {
        "means": means.float(),
        "quats": quats_from_normals(normals, torch.Generator().manual_seed(0)).float(),
        "scales": torch.full((n, 2), math.log(sigma)),
        "opacities": logit(torch.full((n,), 0.97)),
        "sh0": rgb_to_sh(rgb.float())[:, None, :],
        "shN": torch.zeros(n, 0, 3),
    }
    return GaussianModel(params, 0)


def make_viewer_run(out: Path, **wall) -> Path:
    """``out`` as a finished training output folder: config.yaml (the sample scene) +
    point_cloud.ply (:func:`tilted_wall` with the keyword arguments ``wall``)."""
    from splat.config import load_config
    from splat.ply import save_ply
    from splat.run_folder import save_config

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    viewmat, _, _, _ = first_test_camera()
    cfg = load_config(str(ROOT / "configs" / "fast.yaml"), [f"data.path={SAMPLE}", "data.background=[0.1,0.1,0.1]"])
    save_config(cfg, out / "config.yaml")
    save_ply(tilted_wall(viewmat, **wall), out / "point_cloud.ply")
    return out
