"""Test-view metrics of a run: PSNR / SSIM (also inside object masks and
after an affine colour fit) and depth / normal errors against ground truth
stored next to the data (``<stem>_depth.npy``, ``<stem>_normal.npy``).

Used by the trainer at the end of a run and by the benchmarks; it needs only
something that renders views and the run's config."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from .appearance import fit_affine
from .distributed.group import Group, all_gather_objects
from .errors import ConfigError
from .losses import masked_psnr, masked_ssim, psnr, ssim
from .model_render import normalized_normals

__all__ = ["ground_truth_geometry", "check_eval_masks", "evaluate_frames", "frame_metrics", "combine_frame_metrics"]


def ground_truth_geometry(data_dir: Path, stem: str, H: int, W: int):
    """Ground-truth depth/normal next to the data (``<stem>_depth.npy`` /
    ``<stem>_normal.npy``), nearest-sampled at pixel centres if the images
    were downscaled.  Returns (depth [H,W] or None, normal [H,W,3] or None)."""
    out = []
    for suffix in ("depth", "normal"):
        p = Path(data_dir) / f"{stem}_{suffix}.npy"
        if not p.is_file():
            out.append(None)
            continue
        a = np.load(p).astype(np.float32)
        if a.shape[0] != H or a.shape[1] != W:
            sy, sx = a.shape[0] / H, a.shape[1] / W
            rows = np.minimum(((np.arange(H) + 0.5) * sy).astype(int), a.shape[0] - 1)
            cols = np.minimum(((np.arange(W) + 0.5) * sx).astype(int), a.shape[1] - 1)
            a = a[rows][:, cols]
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return out[0], out[1]


def check_eval_masks(cfg: Dict, scene) -> None:
    """``eval.masked=true`` needs a test view with an object mask
    (``Frame.object_mask``): else a one-line ConfigError naming the key
    (``auto`` skips the masked figures instead)."""
    if cfg["eval"]["masked"] is not True or any(f.object_mask is not None for f in scene.test):
        return
    what = (
        f"none of the {len(scene.test)} test view(s) has an object mask"
        if scene.test
        else "the scene has no test views"
    )
    raise ConfigError(
        f"eval.masked=true: {what}; masks are read from transforms.json mask_path "
        "(data.layout=transforms); use eval.masked=auto to skip the masked figures"
    )


def evaluate_frames(
    cfg: Dict,
    background: torch.Tensor,
    frames: Sequence,
    render_views: Callable[[list], dict],
    group: Optional[Group] = None,
) -> dict:
    """Test figures of ``frames`` rendered by ``render_views(views)``, which
    renders a list of N views together (N = ``group.world_size``, 1 without
    a group) and returns {index in the list: output} for the ones this
    process renders; the figures of every process are gathered and combined
    in view order on each (collective).  ``cfg``: the run's config;
    ``background`` [3]: ``data.background``.

    Mean PSNR/SSIM over ``frames`` of the raw render, ``psnr_affine_fit`` of
    the render after the least-squares affine colour fit to each image
    (:func:`splat.appearance.fit_affine`: the number to compare with
    appearance-modelling methods), plus depth/normal errors where ground
    truth files exist next to the data (pixels with z_gt > 0).

    With ``eval.masked`` not ``false``, ``psnr_masked`` / ``ssim_masked``:
    the same means over the frames with an object mask, of
    :func:`splat.losses.masked_psnr` and :func:`splat.losses.masked_ssim`
    (inside the mask only; SSIM after compositing render and photo over
    ``data.background`` outside it), and ``num_views_masked``, how many
    frames they average; absent when no frame has a (non-empty) mask."""
    if not frames:
        return {}
    n = 1 if group is None else group.world_size
    rows = []
    for first in range(0, len(frames), n):
        chunk = list(frames[first : first + n])
        rows += [(first + i, frame_metrics(cfg, background, chunk[i], out)) for i, out in render_views(chunk).items()]
    if group is not None:
        rows = [row for part in all_gather_objects(rows, group) for row in part]
    return combine_frame_metrics([row for _, row in sorted(rows, key=lambda r: r[0])])


def frame_metrics(cfg: Dict, background, f, out) -> dict:
    """The figures of one test view ``f`` rendered as ``out``, as
    :func:`combine_frame_metrics` adds them up (so the views may be rendered
    on different processes and their figures combined anywhere)."""
    rgb = out.rgb.clamp(0, 1).cpu()
    row = {
        "psnr": psnr(rgb, f.image),
        "ssim": float(ssim(rgb, f.image)),
        "psnr_fit": psnr(fit_affine(rgb, f.image)[0], f.image),
        "depth_err_sum": 0.0,
        "normal_err_sum": 0.0,
        "n_px": 0,
    }
    m = f.object_mask if cfg["eval"]["masked"] is not False else None
    p_masked = None if m is None else masked_psnr(rgb, f.image, m)
    if p_masked is not None:  # an empty mask (all cropped away) has no figure
        row["psnr_masked"] = p_masked
        row["ssim_masked"] = masked_ssim(rgb, f.image, m, background)
    z_gt, n_gt = ground_truth_geometry(Path(cfg["data"]["path"]), f.stem, f.height, f.width)
    if z_gt is None:
        return row
    valid = z_gt > 0
    if not bool(valid.any()):
        return row
    z = (out.median_depth if cfg["render"]["depth"] == "median" else out.depth).cpu()
    row["depth_err_sum"] = float(((z - z_gt).abs() / z_gt.clamp_min(1e-12))[valid].sum())
    if n_gt is not None:
        n = normalized_normals(out.normal.cpu(), out.alpha.cpu())
        ngt = n_gt / n_gt.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        cos = (n * ngt).sum(-1).abs().clamp(0, 1)  # GT normals are not oriented
        row["normal_err_sum"] = float(torch.rad2deg(torch.acos(cos))[valid].sum())
    row["n_px"] = int(valid.sum())
    return row


def combine_frame_metrics(rows) -> dict:
    """The test figures (see :func:`evaluate_frames`) of the views' :func:`frame_metrics`, in view order."""
    if not rows:
        return {}
    res = {
        "psnr": float(np.mean([r["psnr"] for r in rows])),
        "ssim": float(np.mean([r["ssim"] for r in rows])),
        "psnr_affine_fit": float(np.mean([r["psnr_fit"] for r in rows])),
        "num_views": len(rows),
    }
    masked = [r for r in rows if "psnr_masked" in r]
    if masked:
        res.update(
            psnr_masked=float(np.mean([r["psnr_masked"] for r in masked])),
            ssim_masked=float(np.mean([r["ssim_masked"] for r in masked])),
            num_views_masked=len(masked),
        )
    n_px = sum(r["n_px"] for r in rows)
    if n_px > 0:
        res["depth_rel_err"] = sum(r["depth_err_sum"] for r in rows) / n_px
        res["normal_deg_err"] = sum(r["normal_err_sum"] for r in rows) / n_px
    return res
