"""Traces a training run (a diagnostic, written for MCMC): at steps 1, 50,
100, 150 and every --every steps, one test view's PSNR and the primitives'
opacity, scale and position statistics, one JSON line each; then the run's
test metrics.  Prints JSON lines, and with --out writes them all as one
JSON record.

    python bench/mcmc_trace.py --shared ../shared --scene still_life \\
        data.layout=nerf strategy.name=mcmc strategy.max_gaussians=24312

Fields: psnr (the first test view, background white), n, opa_mean, dead
(share with opacity < 0.005, MCMC's relocation threshold), opa_hi (share
above 0.5), scale_med / scale_p99 (of each primitive's largest scale),
dist_med / dist_p99 (distance of the means from their median, the spread
that position noise widens), and the strategy's counters.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def snapshot(model, frame, step: int, strategy) -> dict:
    import torch

    from splat.model_render import render_frame

    with torch.no_grad():
        out = render_frame(model, frame, background=torch.ones(3))
        mse = ((out.rgb.clamp(0, 1) - frame.image.to(out.rgb)) ** 2).mean()
        o, s, m = model.opacities.detach(), model.scales.detach(), model.means.detach()
        largest = s.max(1).values  # [N]
        spread = (m - m.median(0).values).norm(dim=1)  # [N]
        return dict(
            step=step,
            psnr=round(float(-10 * torch.log10(mse)), 2),
            n=int(o.numel()),
            opa_mean=round(float(o.mean()), 4),
            dead=round(float((o < 0.005).float().mean()), 4),
            opa_hi=round(float((o > 0.5).float().mean()), 4),
            scale_med=float(largest.median()),
            scale_p99=float(largest.quantile(0.99)),
            dist_med=float(spread.median()),
            dist_p99=float(spread.quantile(0.99)),
            stats=dict(getattr(strategy, "stats", {}) or {}),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", required=True, help="the folder that holds scenes/")
    ap.add_argument("--scene", default="still_life")
    ap.add_argument("--config", default="splat/configs/default.yaml")
    ap.add_argument("--every", type=int, default=250, help="steps between snapshots")
    ap.add_argument("--out", help="also write the record here")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()

    import splat.training.step as step_module
    from splat.config import load_config
    from splat.data import load_scene_from_config
    from splat.trainer import Trainer

    data = Path(args.shared) / "scenes" / args.scene
    cfg = load_config(str(ROOT / args.config), [f"data.path={data}", "log.progress=false", *args.overrides])
    scene = load_scene_from_config(cfg["data"])
    rows = []
    original = step_module.BatchStep.__call__

    def traced(self, model, optimizers, strategy, appearance, step):
        result = original(self, model, optimizers, strategy, appearance, step)
        if step % args.every == 0 or step in (1, 50, 100, 150):
            rows.append(snapshot(model, scene.test[0], step, strategy))
            print(json.dumps(rows[-1]), flush=True)
        return result

    step_module.BatchStep.__call__ = traced
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Trainer(cfg, Path(tmp) / "run", scene=scene, overwrite=True).train()
    record = dict(
        command="python bench/mcmc_trace.py " + " ".join(sys.argv[1:]),
        scene=args.scene,
        config=args.config,
        overrides=args.overrides,
        trace=rows,
        metrics={k: metrics[k] for k in ("test.psnr", "test.ssim", "n_gaussians") if k in metrics},
    )
    print(json.dumps(record["metrics"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
