"""Cost of ``loss.multiview`` per training step on one scene: milliseconds per
step with and without the multi-view terms, the two trainers' steps
alternating one by one in one process so that both see the same machine
load.  Prints JSON (and writes it with --out).  Not a test: the numbers
depend on the machine and its load.

    OMP_NUM_THREADS=2 python bench/multiview_cost.py --shared ../shared --out bench/results/multiview_cost.json

Every trainer starts from the same initial model (``model.init=auto``)
and trains --warmup steps alike (densification from step 500; the default
config's coarse start ends at step 1000), with the distortion and normal
terms on; then the multi-view terms start (``loss.multiview.start`` =
--warmup + 1) in every run but "off", and --steps steps are timed.
``--variant NAME=KEY=VALUE,...`` adds a run with the terms on and those
overrides.  Also timed alone: the multi-view maths of a step
(:meth:`MultiViewTerms.loss`, its forward; its backward is inside the
step), without the partner's render.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import commit, emit, machine  # noqa: E402

from splat.config import load_config  # noqa: E402
from splat.trainer import Trainer  # noqa: E402
from splat.training.multiview_step import MultiViewTerms  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", required=True, help="folder holding scenes/")
    p.add_argument("--scene", default="still_life")
    p.add_argument("--config", default="default", choices=["default", "fast"])
    p.add_argument("--primitive", default="2dgs", choices=["2dgs", "3dgs"])
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=KEY=VALUE,...",
        help="a further run with the terms on and these overrides (repeatable), e.g. "
        "detached=loss.multiview.neighbour_gradient=false",
    )
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*", help="config overrides key=value applied to both runs")
    args = p.parse_args()

    scene = Path(args.shared) / "scenes" / args.scene
    common = [
        f"data.path={scene}",
        f"model.primitive={args.primitive}",
        "log.progress=false",
        "loss.dist_from=0",
        "loss.normal_from=0",
        *args.overrides,
    ]
    cfg_file = str(ROOT / "configs" / f"{args.config}.yaml")
    on = ["loss.multiview.enabled=true", f"loss.multiview.start={args.warmup + 1}"]
    runs = {"off": load_config(cfg_file, common), "on": load_config(cfg_file, common + on)}
    for spec in args.variant:
        name, _, overrides = spec.partition("=")
        runs[name] = load_config(cfg_file, common + on + [o for o in overrides.split(",") if o])
    maths = []
    original = MultiViewTerms.loss

    def timed_loss(self, *a, **k):
        t0 = time.perf_counter()
        out = original(self, *a, **k)
        maths.append(time.perf_counter() - t0)
        return out

    MultiViewTerms.loss = timed_loss
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {k: Trainer(cfg, Path(tmp) / k) for k, cfg in runs.items()}
        times = {k: [] for k in runs}
        terms = {}
        for step in range(1, args.warmup + args.steps + 1):
            for k, t in trainers.items():
                t0 = time.perf_counter()
                terms[k] = t.train_step(step)
                if step > args.warmup:
                    times[k].append(time.perf_counter() - t0)
        surfels = {k: int(t.model.means.shape[0]) for k, t in trainers.items()}
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    # With loss.multiview.every > 1 the median is a step without the terms: the mean is the cost.
    mean = {k: 1000 * statistics.fmean(v) for k, v in times.items()}
    emit(
        dict(
            command=" ".join([os.path.basename(sys.executable), *sys.argv]),
            commit=commit(str(ROOT)),
            machine=machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
            scene=args.scene,
            config=args.config,
            primitive=args.primitive,
            steps_timed=args.steps,
            surfels=surfels,
            ms_per_step_median=ms,
            ms_per_step_mean=mean,
            ratio_on_off=ms["on"] / ms["off"],
            ratio_to_off={k: v / ms["off"] for k, v in ms.items() if k != "off"},
            mean_ratio_to_off={k: v / mean["off"] for k, v in mean.items() if k != "off"},
            multiview_maths_ms_median=1000 * statistics.median(maths),
            last_terms={k: v for k, v in terms.items() if k != "off"},
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
