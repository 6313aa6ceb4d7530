"""Where in the image one run's test error differs from another's: near
depth discontinuities, on textured or smooth surface, or on background.
Prints JSON (and writes it with --out).

    OMP_NUM_THREADS=2 python bench/error_regions.py --runs RUN_A RUN_B --out bench/results/X.json

Both runs (folders of ``train.py``) must be of the same scene, whose test
views have ground-truth depth next to the data (``<stem>_depth.npy``,
:func:`splat.evaluation.ground_truth_geometry`).  Every test pixel falls in
one region:

* ``near_jumps``: within ``--dilate`` pixels of a depth discontinuity of the
  ground truth (:func:`splat.losses.depth_jump_weight` of it is 0 at
  ``--max-bend``);
* ``textured`` / ``smooth``: the other pixels with geometry, split at the
  ``--texture-quantile`` of the photo's normalised gradient
  (``1 - sqrt(image_edge_weight)``) over them;
* ``background``: no geometry (ground-truth depth 0).

For each run and region: the summed squared error (mean over channels,
summed over the pixels of every test view) and its share of the total; and
each region's share of the difference between the runs' totals (the first
run minus each other).  The same for the depth error as
:func:`splat.evaluation.frame_metrics` measures it (``|z - z_gt| / z_gt``
of the depth ``render.depth`` names, on pixels with geometry, so the
background has none): ``depth_error`` and ``depth_difference_share``;
``depth_error`` divided by the number of geometry pixels of every view,
summed over the regions, is the run's ``test.depth_rel_err``.
``depth_error_near_jumps`` splits the ``near_jumps`` part between
``silhouettes`` (within ``--dilate`` pixels of a pixel without geometry:
the edge of the scene against its sky or backdrop) and ``occlusions`` (one
surface in front of another).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

REGIONS = ("near_jumps", "textured", "smooth", "background")


def view_regions(depth_gt, image, max_bend: float, dilate: int):
    """One view's masks [H, W] (module doc) before the texture split:
    ``near_jumps``, ``surface`` (geometry away from jumps), ``background``,
    and the photo's normalised gradient [H, W] that splits the surface."""
    import torch
    import torch.nn.functional as F

    from splat.losses import depth_jump_weight, image_edge_weight

    geometry = depth_gt > 0
    interior = torch.zeros_like(geometry)
    interior[1:-1, 1:-1] = True  # depth_jump_weight is 0 on the border: no discontinuity there
    jump = (depth_jump_weight(depth_gt.double(), max_bend) == 0) & geometry & interior
    near = F.max_pool2d(jump[None, None].float(), 2 * dilate + 1, 1, dilate)[0, 0] > 0
    gradient = (1.0 - image_edge_weight(image).sqrt()) * interior  # [H, W] in [0, 1]; the border has none
    return dict(near_jumps=near, surface=geometry & ~near, background=~geometry & ~near), gradient


def silhouettes(depth_gt, dilate: int):
    """[H, W] bool: the pixels within ``dilate`` pixels of one without
    geometry (ground-truth depth 0), themselves included."""
    import torch.nn.functional as F

    empty = (depth_gt <= 0)[None, None].float()
    return F.max_pool2d(empty, 2 * dilate + 1, 1, dilate)[0, 0] > 0


def split_texture(regions: dict, gradient, texture_threshold: float) -> dict:
    """:data:`REGIONS` of one view: its surface split at ``texture_threshold``."""
    textured = regions["surface"] & (gradient > texture_threshold)
    return dict(
        near_jumps=regions["near_jumps"],
        textured=textured,
        smooth=regions["surface"] & ~textured,
        background=regions["background"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run folders; the first is the reference")
    ap.add_argument("--max-bend", type=float, default=0.02)
    ap.add_argument("--dilate", type=int, default=2, help="pixels around a discontinuity counted as near it")
    ap.add_argument("--texture-quantile", type=float, default=0.75)
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    from splat.data import load_scene_from_config
    from splat.data.background import configured_background
    from splat.evaluation import ground_truth_geometry
    from splat.model_render import render_frame
    from splat.trained_run import load_run

    # Runs are named by their path below the folder holding them all: two
    # runs of one scene often share the last folder name.
    parent = os.path.commonpath([os.path.dirname(os.path.abspath(r)) for r in args.runs])
    names = {run: os.path.relpath(os.path.abspath(run), parent) for run in args.runs}
    errors, depths_of, scene, data_dir = {}, {}, None, None
    for run in args.runs:
        with open(os.devnull, "w") as quiet:
            model, cfg, _ = load_run(Path(run), log=quiet)
        if scene is None:
            scene, data_dir = load_scene_from_config(cfg["data"]), Path(cfg["data"]["path"])
        background = torch.tensor(configured_background(cfg["data"]), dtype=torch.float32)
        per_view, depth_per_view = [], []
        with torch.no_grad():
            for f in scene.test:
                out = render_frame(model, f, background, near=cfg["render"]["near"], far=cfg["render"]["far"])
                per_view.append(((out.rgb.clamp(0, 1).cpu() - f.image) ** 2).mean(-1))  # [H, W]
                depth_per_view.append((out.median_depth if cfg["render"]["depth"] == "median" else out.depth).cpu())
        errors[names[run]], depths_of[names[run]] = per_view, depth_per_view

    depths = []
    for f in scene.test:
        depth, _ = ground_truth_geometry(data_dir, f.stem, f.height, f.width)
        if depth is None:
            sys.exit(f"error: {data_dir}: test view {f.stem} has no {f.stem}_depth.npy (ground-truth depth)")
        depths.append(depth)
    views = [view_regions(d, f.image, args.max_bend, args.dilate) for d, f in zip(depths, scene.test)]
    threshold = float(torch.cat([g[r["surface"]] for r, g in views]).quantile(args.texture_quantile))
    masks = [split_texture(r, g, threshold) for r, g in views]
    pixels = sum(m["near_jumps"].numel() for m in masks)

    def sse(run, region):
        return float(sum(e[m[region]].sum() for e, m in zip(errors[run], masks)))

    edges = [silhouettes(z_gt, args.dilate) for z_gt in depths]

    def depth_error(run, region, within=None):
        total = 0.0
        for k, (z, z_gt, m) in enumerate(zip(depths_of[run], depths, masks)):
            pick = m[region] & (z_gt > 0) & (within[k] if within is not None else True)
            total += float(((z[pick] - z_gt[pick]).abs() / z_gt[pick]).sum())
        return total

    def shares(errors_of: dict) -> dict:
        totals = {run: sum(errors_of[run].values()) for run in runs}
        return {
            run: {r: (errors_of[ref][r] - errors_of[run][r]) / (totals[ref] - totals[run]) for r in REGIONS}
            for run in runs[1:]
            if totals[ref] != totals[run]
        }

    runs = list(names.values())
    ref = runs[0]
    report = dict(
        command=f"python bench/error_regions.py {' '.join(sys.argv[1:])}",
        commit=commit(str(ROOT)),
        machine=machine(),
        runs=runs,
        texture_threshold=threshold,
        pixel_share={r: sum(float(m[r].sum()) for m in masks) / pixels for r in REGIONS},
        squared_error={run: {r: sse(run, r) for r in REGIONS} for run in runs},
        geometry_pixels=sum(int((z_gt > 0).sum()) for z_gt in depths),
        depth_error={run: {r: depth_error(run, r) for r in REGIONS} for run in runs},
    )
    report["depth_error_near_jumps"] = {
        run: {
            "silhouettes": depth_error(run, "near_jumps", edges),
            "occlusions": depth_error(run, "near_jumps", [~e for e in edges]),
        }
        for run in runs
    }
    report["difference_share"] = shares(report["squared_error"])
    report["depth_difference_share"] = shares(report["depth_error"])
    emit(report, args.out)


if __name__ == "__main__":
    main()
