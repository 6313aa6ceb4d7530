"""A trained run's views written to files: images, depth, normals and alpha.

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

from .data.background import configured_background
from .model_render import normalized_normals, render_frame
from .progress import use_progress_bar
from .trained_run import load_run


def _render_outputs(model, cfg, frame):
    """(rgb uint8 [H,W,3], depth [H,W], normal [H,W,3], alpha [H,W]) as numpy float32."""
    r = cfg["render"]
    bg = torch.tensor(configured_background(cfg["data"]), dtype=torch.float32)
    with torch.no_grad():
        out = render_frame(model, frame, bg, backend=r["backend"], near=r["near"], far=r["far"])
    alpha = out.alpha.detach().cpu().float()
    depth = (out.median_depth if r["depth"] == "median" else out.depth).detach().cpu().float()
    depth = torch.where(alpha > 0, depth, torch.zeros_like(depth))
    normal = normalized_normals(out.normal.detach().cpu().float(), alpha)
    rgb = (out.rgb.detach().cpu().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8)
    return rgb.numpy(), depth.numpy(), normal.numpy(), alpha.numpy()


def render_split(model_dir, data: Optional[str] = None, split: str = "test", overrides=(), progress="auto") -> Path:
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
