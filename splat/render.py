"""Rendering a trained model: per-view images, depth, normals and alpha.

``python render.py --model OUT --split test`` writes, for every view of the
split (``<stem>`` = image file name without extension)::

    OUT/renders/<split>/rgb/<stem>.png      8-bit sRGB render over the config's background
    OUT/renders/<split>/depth/<stem>.npy    float32 [H, W] camera-space z, 0 where nothing is hit
    OUT/renders/<split>/normal/<stem>.npy   float32 [H, W, 3] world-space unit normals facing
                                            the camera (0 where alpha = 0)
    OUT/renders/<split>/alpha/<stem>.npy    float32 [H, W] accumulated opacity

Depth choice (config ``render.depth``, default ``expected``): the
*expected* depth ``sum w z / alpha`` (normalised by alpha, so the background
does not pull it towards 0).  We measured both on data/sample_scene (NeRF
layout, 1000 steps, test views, mean |z - z_gt| / z_gt over pixels with
z_gt > 0): expected 1.6 %, *median* 6.4 %.  The median (the z of the last
surfel entered with T > 0.5) is not averaged across surfaces, but where a
pixel's alpha stays below 0.5 it is the z of whatever surfel came last
(often a floater far behind), and it is noisier on surfaces too (2.8 % vs
2.0 % where alpha >= 0.5).  ``render.depth=median`` selects the median; the
trainer's depth metrics and the TSDF mesh use the same choice.

Meshes (``render.py --mesh`` / ``--unbounded``) live in :mod:`splat.mesh`; the
command line in :mod:`splat.render_cli`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .errors import SplatInputError
from .progress import use_progress_bar

#: Set by tests/tools to substitute a rasterizer with the same signature.
RASTERIZE_OVERRIDE = None


def get_rasterize():
    """``splat.rasterize`` (imported lazily so this module loads without it)."""
    if RASTERIZE_OVERRIDE is not None:
        return RASTERIZE_OVERRIDE
    import splat

    fn = getattr(splat, "rasterize", None)
    if callable(fn):
        return fn
    from splat.rasterize import rasterize

    return rasterize


def render_frame(
    model,
    frame,
    background: Optional[torch.Tensor] = None,  # [3]
    sh_degree: Optional[int] = None,
    backend: str = "auto",
    near: float = 0.2,
    far: float = 100.0,
    device: Optional[torch.device] = None,
):
    """Rasterize ``model`` (a :class:`splat.model.GaussianModel`) in ``frame``'s camera,
    with :func:`splat.rasterize` or, for 3D Gaussians, :func:`splat.rasterize_3dgs`.

    ``sh_degree`` (default: the model's max) selects how many SH bands are used.
    Returns the rasterizer's output object (rgb, alpha, depth, median_depth,
    normal, distortion, radii, means2d).
    """
    d = model.sh_degree if sh_degree is None else min(int(sh_degree), model.sh_degree)
    dev = device if device is not None else model.means.device
    if model.primitive == "3dgs":
        from .rasterize_3dgs import rasterize_3dgs

        rasterize = rasterize_3dgs
    else:
        rasterize = get_rasterize()
    return rasterize(
        model.means,
        model.quats,
        model.scales,
        model.opacities,
        model.colors(d),  # [N, (d+1)^2, 3]
        frame.viewmat.to(dev),
        frame.K.to(dev),
        int(frame.width),
        int(frame.height),
        near=near,
        far=far,
        background=None if background is None else background.to(dev),
        sh_degree=d,
        backend=backend,
    )


def normalized_normals(normal: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Unit normals where alpha > 0, zero elsewhere. normal [H, W, 3], alpha [H, W]."""
    n = normal / normal.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.where((alpha > 0)[..., None], n, torch.zeros_like(n))


# ------------------------------------------------------------ loading a run
def load_run(model_dir, data: Optional[str] = None, overrides=()):
    """(model, cfg, scene) of a training output folder.

    The model comes from ``point_cloud.ply`` (written at the end of training)
    or, for an unfinished run, from the newest checkpoint.  ``data`` replaces
    the data folder recorded in ``config.yaml``.  A model with no surfels is
    a SplatInputError naming its file.
    """
    from .data import load_scene_from_config
    from .model import GaussianModel
    from .ply import load_ply
    from .checkpoint import read_run_file
    from .distributed.checkpoint import load_latest_checkpoint
    from .config import load_config

    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.yaml"
    if not cfg_path.is_file():
        raise SplatInputError(f"{cfg_path}: not found (is {model_dir} a training output folder?)")
    cfg = load_config(str(cfg_path), overrides)
    if data is not None:
        cfg["data"]["path"] = str(data)
    ply = model_dir / "point_cloud.ply"
    if ply.is_file():
        model, source = load_ply(ply), ply
    else:
        run = read_run_file(model_dir)
        ckpt = load_latest_checkpoint(model_dir, run["run_id"] if run else None)
        if ckpt is None:
            raise SplatInputError(f"{model_dir}: neither point_cloud.ply nor a readable checkpoint of this run")
        model, source = GaussianModel(ckpt["params"], ckpt["sh_degree"]), ckpt["path"]
    if model.num_gaussians == 0:
        # An error, not a warning: every image would be the background alone
        # and a mesh empty, which is no use and easy to mistake for a result.
        raise SplatInputError(f"{source}: the model has no surfels: nothing to render")
    scene = load_scene_from_config(cfg["data"])
    return model, cfg, scene


def _render_outputs(model, cfg, frame):
    """(rgb uint8 [H,W,3], depth [H,W], normal [H,W,3], alpha [H,W]) as numpy float32."""
    r = cfg["render"]
    bg = torch.tensor(cfg["data"]["background"], dtype=torch.float32)
    with torch.no_grad():
        out = render_frame(model, frame, bg, backend=r["backend"], near=r["near"], far=r["far"])
    alpha = out.alpha.detach().cpu().float()
    depth = (out.median_depth if r["depth"] == "median" else out.depth).detach().cpu().float()
    depth = torch.where(alpha > 0, depth, torch.zeros_like(depth))
    normal = normalized_normals(out.normal.detach().cpu().float(), alpha)
    rgb = (out.rgb.detach().cpu().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8)
    return rgb.numpy(), depth.numpy(), normal.numpy(), alpha.numpy()


def render_split(model_dir, data: Optional[str] = None, split: str = "test", overrides=(),
                 progress="auto") -> Path:
    """Write rgb/depth/normal/alpha for every view of ``split``; returns the folder.

    ``progress``: ``"auto"`` (a tqdm bar only when stderr is a terminal),
    True or False (:func:`splat.progress.use_progress_bar`)."""
    from PIL import Image

    model, cfg, scene = load_run(model_dir, data, overrides)
    frames = {"test": scene.test, "train": scene.train}[split]
    root = Path(model_dir) / "renders" / split
    for sub in ("rgb", "depth", "normal", "alpha"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    it = frames
    if use_progress_bar(progress):
        from tqdm import tqdm

        it = tqdm(frames, desc=f"render {split}", dynamic_ncols=True)
    for f in it:
        rgb, depth, normal, alpha = _render_outputs(model, cfg, f)
        Image.fromarray(rgb).save(root / "rgb" / f"{f.stem}.png")
        np.save(root / "depth" / f"{f.stem}.npy", depth.astype(np.float32))
        np.save(root / "normal" / f"{f.stem}.npy", normal.astype(np.float32))
        np.save(root / "alpha" / f"{f.stem}.npy", alpha.astype(np.float32))
    print(f"wrote {len(frames)} {split} views to {root}", file=sys.stderr)
    return root

