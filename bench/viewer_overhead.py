#!/usr/bin/env python
"""Training speed with the live viewer attached but idle (no browser) vs without it.

    python bench/viewer_overhead.py --out bench/results/viewer_overhead_cpu.json

Trains the bundled sample scene (configs/fast.yaml, ``--steps`` steps, the
scene loaded once) in ``--reps`` pairs of runs, alternating which arm goes
first so that drifting machine load hits both alike.  The "viewer" arm starts
a :class:`splat.viewer.server.TrainingView` (server and render thread
running) and passes its hook to the Trainer, as ``train.py --viewer`` does;
the other arm has no viewer at all.  Steps/s = steps / the trainer's
``train_seconds`` (training only, no evaluation).  Prints JSON; the overhead is
1 - the median over reps of (viewer steps/s / without steps/s).
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one_run(cfg, scene, with_viewer: bool) -> float:
    from splat.model import GaussianModel
    from splat.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out, scene=scene)
        view = None
        if with_viewer:
            from splat.viewer.camera import start_view_from_camera
            from splat.viewer.server import TrainingView

            f = scene.test[0]
            start = start_view_from_camera(
                f.viewmat.double().numpy(),
                f.K.double().numpy(),
                f.height,
                trainer.model.means.detach().double().mean(0).numpy(),
            )
            view = TrainingView(GaussianModel(trainer.model.raw_state(), trainer.model.sh_degree), start, port=0)
            trainer.callbacks.append(view.callback)
        try:
            trainer.train()
        finally:
            if view is not None:
                view.close()
        return trainer.step / trainer.train_seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args()

    import torch

    from splat.config import load_config
    from splat.data import load_scene_from_config

    cfg = load_config(
        str(ROOT / "configs" / "fast.yaml"),
        [
            f"data.path={ROOT / 'data' / 'sample_scene'}",
            f"train.iterations={args.steps}",
            "log.progress=false",
            "checkpoint.every=0",
        ],
    )
    scene = load_scene_from_config(cfg["data"])
    runs = {"without": [], "viewer_idle": []}
    t0 = time.time()
    for rep in range(args.reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        for with_viewer in order:
            sps = one_run(cfg, scene, with_viewer)
            runs["viewer_idle" if with_viewer else "without"].append(round(sps, 3))
            print(f"rep {rep}: {'viewer idle' if with_viewer else 'without   '} {sps:.2f} steps/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = [round(v / w, 4) for v, w in zip(runs["viewer_idle"], runs["without"])]
    result = {
        "scene": "data/sample_scene",
        "config": "configs/fast.yaml",
        "steps": args.steps,
        "reps": args.reps,
        "steps_per_s": runs,
        "median_steps_per_s": med,
        # each rep's two runs are back to back: their ratio cancels slow drifts in machine load
        "paired_ratio_viewer_over_without": ratios,
        "overhead_percent": round(100.0 * (1.0 - statistics.median(ratios)), 2),
        "overhead_percent_of_medians": round(100.0 * (med["without"] - med["viewer_idle"]) / med["without"], 2),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "wall_seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
