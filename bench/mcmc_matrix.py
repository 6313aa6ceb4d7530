"""MCMC against the default strategy at the same primitive count (issue 40,
part 1): fast and default configs, surfels and 3D Gaussians, still_life and
dtu_scan24.

::

    OMP_NUM_THREADS=2 python bench/mcmc_matrix.py --shared ../shared --out bench/results/mcmc_matrix.json

Per cell (scene x config x primitive), one :mod:`quality` run with the
default strategy, then one with ``strategy.name=mcmc
strategy.max_gaussians=<the default run's final count>``, one after another
in child processes: test PSNR / SSIM, depth and normal error (still_life has
ground truth), primitives, training seconds.  dtu_scan24 trains at a quarter
of its resolution (``data.downscale=4``), as in its other tables, and under
``fast.yaml`` MCMC refines every 50 steps there (``strategy.refine_every=50``)
so that its 5 % growth can reach the default strategy's count inside the
window (``docs/training.md``, "The budget").  Seed 0, ``model.init=auto``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

SCENE_OVERRIDES = {"still_life": [], "dtu_scan24": ["data.downscale=4"]}
#: Extra MCMC overrides per (scene, config): growth 1.05x per refinement must reach the count.
MCMC_EXTRA = {("dtu_scan24", "fast"): ["strategy.refine_every=50"]}
METRICS = ("test.psnr", "test.ssim", "test.depth_rel_err", "test.normal_deg_err", "n_gaussians", "train_seconds")


def quality_run(shared: str, scene: str, config: str, overrides) -> dict:
    """One ``bench/quality.py`` run; its metrics and command."""
    # The options take lists (nargs="+"): an option after them ends the list before the overrides.
    args = ["--shared", shared, "--scenes", scene, "--configs", config, "--inits", "auto"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.json"
        cmd = [sys.executable, str(ROOT / "bench" / "quality.py"), *args, "--out", str(out), *overrides]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=sys.stderr)
        run = json.loads(out.read_text())["runs"][0]
    metrics = {k: run["metrics"].get(k) for k in METRICS}
    return dict(
        command="python bench/quality.py " + " ".join([*args, "--out", "RUN.json", *overrides]), metrics=metrics
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", required=True, help="folder holding scenes/")
    ap.add_argument("--scenes", nargs="+", default=list(SCENE_OVERRIDES), choices=list(SCENE_OVERRIDES))
    ap.add_argument("--configs", nargs="+", default=["fast", "default"], choices=["fast", "default"])
    ap.add_argument("--primitives", nargs="+", default=["2dgs", "3dgs"], choices=["2dgs", "3dgs"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cells = []
    for config in args.configs:
        for scene in args.scenes:
            for primitive in args.primitives:
                base = [*SCENE_OVERRIDES[scene], f"model.primitive={primitive}", "seed=0"]
                default = quality_run(args.shared, scene, config, base)
                count = int(default["metrics"]["n_gaussians"])
                mcmc_overrides = [*base, "strategy.name=mcmc", f"strategy.max_gaussians={count}",
                                  *MCMC_EXTRA.get((scene, config), [])]  # fmt: skip
                mcmc = quality_run(args.shared, scene, config, mcmc_overrides)
                d, m = default["metrics"], mcmc["metrics"]
                delta = {k: (None if d[k] is None or m[k] is None else round(m[k] - d[k], 4)) for k in METRICS}
                cells.append(dict(scene=scene, config=config, primitive=primitive, default=default, mcmc=mcmc,
                                  mcmc_minus_default=delta))  # fmt: skip
                print(json.dumps(cells[-1]), file=sys.stderr, flush=True)
    emit(
        dict(
            benchmark="mcmc_matrix",
            command=f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} python bench/mcmc_matrix.py "
            + " ".join(sys.argv[1:]),
            commit=commit(str(ROOT)),
            machine=machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
            cells=cells,
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
