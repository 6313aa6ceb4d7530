"""Collect finished training runs into one JSON table (README figures).

::

    python bench/collect_runs.py --out bench/results/training_real_scenes.json \\
        --machine "2-core CPU, idle" \\
        dtu_fast_sfm=/tmp/runs/dtu_fast_sfm fox_fast=/tmp/runs/fox_fast ...

For each ``name=OUT`` it reads ``OUT/metrics.json`` (test PSNR / SSIM, the
PSNR after fitting a per-image affine colour correction on the test image,
surfels, training seconds, peak memory) and ``OUT/config.yaml``, and the
command line recorded in ``OUT/run.json`` when there is one.  Where the
scene has object masks (``mask/NNN.png`` beside ``images/``, DTU's layout)
and ``OUT/renders/test/rgb`` exists (``render.py --split test``), it adds
the PSNR inside and outside the masks: held-out views of an unmasked
object-centric capture lose most of their PSNR on background the training
views barely see.  A run trained with ``eval.masked`` on a scene whose test
views have ``transforms.json`` masks already holds its masked PSNR / SSIM in
``metrics.json`` (``test.psnr_masked``, ``test.ssim_masked``): they are
copied as ``test_psnr_masked`` / ``test_ssim_masked``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import emit, machine  # noqa: E402


def _masked_psnr(out: Path, cfg: dict):
    import cv2

    from splat.data import load_scene_from_config

    mask_dir = Path(cfg["data"]["path"]) / "mask"
    rgb_dir = out / "renders" / "test" / "rgb"
    if not mask_dir.is_dir() or not rgb_dir.is_dir():
        return None
    scene = load_scene_from_config(cfg["data"])
    inside, outside = [], []
    for f in scene.test:
        render = cv2.imread(str(rgb_dir / f"{f.stem}.png"), cv2.IMREAD_COLOR)
        names = [f.stem] + ([f"{int(f.stem):03d}"] if f.stem.isdigit() else [])  # DTU: 000000.png -> 000.png
        masks = [p for name in names for p in sorted(mask_dir.glob(f"{name}.*"))]
        if render is None or not masks:
            return None
        m = cv2.imread(str(masks[0]), cv2.IMREAD_GRAYSCALE)
        if m.shape != (f.height, f.width):
            m = cv2.resize(m, (f.width, f.height), interpolation=cv2.INTER_NEAREST)
        obj = m > 127
        err = ((render[..., ::-1] / 255.0 - f.image.numpy()) ** 2).mean(-1)
        inside.append(-10 * math.log10(max(float(err[obj].mean()), 1e-12)))
        outside.append(-10 * math.log10(max(float(err[~obj].mean()), 1e-12)))
    return {"psnr_inside_mask": float(np.mean(inside)), "psnr_outside_mask": float(np.mean(outside))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--machine", default="", help="where and under what load the runs were made")
    ap.add_argument("runs", nargs="+", help="name=OUTPUT_FOLDER of finished train.py runs")
    args = ap.parse_args(argv)

    from splat.config import load_config

    table = {}
    for item in args.runs:
        name, _, folder = item.partition("=")
        out = Path(folder)
        if not (out / "metrics.json").is_file():
            raise SystemExit(f"{item}: no {out / 'metrics.json'} (the run has not finished)")
        metrics = json.loads((out / "metrics.json").read_text())
        cfg = load_config(out / "config.yaml", [])
        row = {
            "scene": cfg["data"]["path"],
            "downscale": cfg["data"]["downscale"],
            "init": cfg["model"]["init"],
            "iterations": metrics["iterations"],
            "surfels": metrics["n_gaussians"],
            "train_seconds": metrics["train_seconds"],
            "peak_memory_mb": metrics["peak_memory_mb"],
            "test_psnr": metrics["test.psnr"],
            "test_ssim": metrics["test.ssim"],
            "test_psnr_affine_fit": metrics.get("test.psnr_affine_fit"),
            "test_views": metrics.get("test.num_views"),
        }
        if metrics.get("test.psnr_masked") is not None:  # eval.masked: the trainer's own masked figures
            row.update(
                test_psnr_masked=metrics["test.psnr_masked"],
                test_ssim_masked=metrics["test.ssim_masked"],
                test_views_masked=metrics.get("test.num_views_masked"),
            )
        extra = _masked_psnr(out, cfg)
        if extra:
            row.update(extra)
        table[name] = row
    emit({"machine": machine(note=args.machine), "runs": table}, args.out)


if __name__ == "__main__":
    main()
