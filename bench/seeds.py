"""Seed statistics of training runs across source trees and config
variants: is a change in test PSNR a change, or the seed?  And where in
the image is it?

::

    python bench/seeds.py --data SCENE --trees OLD . --seeds 0 1 2 data.layout=transforms data.downscale=4
    python bench/seeds.py --data SCENE --seeds 0 1 2 3 --variant base= \\
        --variant late_regularisers="loss.dist_from=1000 loss.normal_from=1500" --out bench/results/X.json

Every (tree, variant, seed) trains with that tree's own ``train.py`` (a
child process, ``PYTHONPATH`` at the tree's root, ``OMP_NUM_THREADS`` =
``--threads``; build each tree first), ``--jobs`` of them at a time.  Each
finished model is then evaluated by *this* tree, the same way for every
tree: test PSNR over the whole image and, where the test views have object
masks (``transforms.json`` ``mask_path``), inside and outside them, since a
sparse capture's held-out views lose most of their PSNR on background that
few training views see.  The run's own ``init:`` line, primitive count and
training time are kept.

The summary gives each cell's mean and standard deviation over the seeds,
and each cell's per-seed differences from the first cell (the first tree's
first variant) with their mean, standard deviation and t statistic (paired
by seed: a seed draws the same test views and, within one tree, the same
first steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

#: The figures summarised per cell.
FIGURES = (
    "psnr",
    "psnr_in_mask",
    "psnr_outside_mask",
    "depth_rel_err",
    "normal_deg_err",
    "n_primitives",
    "train_seconds",
)


def evaluate(run_dir: Path) -> dict:
    """Test PSNR of the model in ``run_dir`` (whole image, inside and outside
    the test views' object masks: :func:`splat.losses.masked_psnr` with the
    mask and its complement), rendered by this tree's splat; each view's
    PSNR, averaged over the views, as the trainer reports it."""
    import torch

    from splat.data import load_scene_from_config
    from splat.data.background import configured_background
    from splat.losses import masked_psnr, psnr
    from splat.model_render import render_frame
    from splat.trained_run import load_run

    with open(os.devnull, "w") as quiet:
        model, cfg, _ = load_run(run_dir, log=quiet)
    scene = load_scene_from_config(cfg["data"], eval_masks=True)  # test views: given poses, and their masks
    background = torch.tensor(configured_background(cfg["data"]), dtype=torch.float32)
    whole, inside, outside = [], [], []
    with torch.no_grad():
        for f in scene.test:
            out = render_frame(model, f, background, near=cfg["render"]["near"], far=cfg["render"]["far"])
            rgb = out.rgb.clamp(0, 1).cpu()  # [H, W, 3]
            whole.append(psnr(rgb, f.image))
            if f.object_mask is not None:
                m = f.object_mask.to(rgb.dtype)  # [H, W] in [0, 1]
                inside.append(masked_psnr(rgb, f.image, m))
                outside.append(masked_psnr(rgb, f.image, 1.0 - m))

    def mean(values):
        values = [v for v in values if v is not None]
        return float(sum(values) / len(values)) if values else None

    return dict(psnr=mean(whole), psnr_in_mask=mean(inside), psnr_outside_mask=mean(outside), views=len(whole))


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    n = len(values)
    mu = sum(values) / n
    sd = math.sqrt(sum((v - mu) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return dict(mean=round(mu, 6), std=None if sd is None else round(sd, 6), n=n)


def summarise(runs: list, cells: list) -> dict:
    """Per cell: each figure's mean / std over seeds; per-seed differences from cells[0]."""
    by = {(r["cell"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out = {}
    for cell in cells:
        rows = [by[(cell, s)] for s in seeds if (cell, s) in by]
        entry = {k: _stats([r.get(k) for r in rows]) for k in FIGURES}
        if cell != cells[0]:
            for k in ("psnr", "psnr_in_mask", "psnr_outside_mask", "depth_rel_err", "normal_deg_err"):
                diffs = [
                    by[(cell, s)][k] - by[(cells[0], s)][k]
                    for s in seeds
                    if (cell, s) in by and (cells[0], s) in by and by[(cell, s)].get(k) is not None
                    and by[(cells[0], s)].get(k) is not None
                ]  # fmt: skip
                st = _stats(diffs)
                if st and st["std"]:
                    st["t"] = round(st["mean"] / (st["std"] / math.sqrt(st["n"])), 2)
                entry[f"{k}_minus_{cells[0]}"] = st
        out[cell] = entry
    return out


class _Finished:
    """Stands for the process of a run that finished in an earlier sweep (``--keep``)."""

    returncode = 0

    def poll(self):
        return 0


def table(summary: dict, cells: list) -> list:
    """One flat record per cell of :func:`summarise` (mean ± std, the
    difference from the first cell with its t), as the docs show it."""

    def pm(st, digits=2, scale=1.0):
        if st is None:
            return None
        mean, std = scale * st["mean"], None if st["std"] is None else scale * st["std"]
        return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")

    rows = []
    for cell in cells:
        e = summary.get(cell, {})
        row = {"cell": cell, "seeds": (e.get("psnr") or {}).get("n")}
        for k in ("psnr", "psnr_in_mask", "psnr_outside_mask"):
            row[k] = pm(e.get(k))
        for k in ("psnr", "psnr_in_mask", "psnr_outside_mask"):
            d = e.get(f"{k}_minus_{cells[0]}")
            row[f"{k} change"] = None if d is None else f"{d['mean']:+.2f}" + (f" (t {d['t']})" if "t" in d else "")
        if e.get("depth_rel_err") is not None:  # scenes with ground-truth depth and normals
            row["depth %"] = pm(e["depth_rel_err"], 3, scale=100)
            row["normals deg"] = pm(e.get("normal_deg_err"))
        row["primitives"] = pm(e.get("n_primitives"), 0)
        row["train s"] = pm(e.get("train_seconds"), 0)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the scene folder")
    p.add_argument("--trees", nargs="+", default=[str(ROOT)], help="source trees (built), first = reference")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--config", default="configs/fast.yaml", help="relative to each tree")
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME=OVERRIDES",
        help="a named set of space-separated overrides (repeatable; 'base=' for none)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="runs at once")
    p.add_argument(
        "--keep",
        default=None,
        help="keep the run folders here (default: a temporary folder); a finished run found there is not retrained",
    )
    p.add_argument("--note", default=None, help="recorded as is (how the scene was prepared, ...)")
    p.add_argument("--out", default=None)
    p.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = p.parse_args()
    variants = {}
    for spec in args.variant or ["base="]:
        name, sep, ov = spec.partition("=")
        if not sep or not name:
            p.error(f"--variant {spec!r}: expected NAME=OVERRIDES")
        variants[name] = ov.split()
    trees = [Path(t).resolve() for t in args.trees]
    for t in trees:
        if not (t / "train.py").is_file() or not (t / args.config).is_file():
            p.error(f"--trees: {t} has no train.py or {args.config}")
    tags = [commit(str(t)) or t.name for t in trees]
    cells = [f"{tag}:{v}" if len(trees) > 1 else v for tag in tags for v in variants]

    # Absolute: each run's working folder is its tree.
    data = Path(args.data).resolve()
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="splat_seeds_"))
    work.mkdir(parents=True, exist_ok=True)
    queue = []
    for seed in args.seeds:  # seed-major: a stopped run still has every cell's first seeds
        for tree, tag in zip(trees, tags):
            for v, ov in variants.items():
                cell = f"{tag}:{v}" if len(trees) > 1 else v
                name = re.sub(r"[^\w.-]", "_", f"{cell}_s{seed}")
                queue.append(dict(tree=tree, cell=cell, seed=seed, overrides=[*args.overrides, *ov], dir=work / name))
    running, runs = [], []
    while queue or running:
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            job["log"] = job["dir"].with_suffix(".log")
            if (job["dir"] / "metrics.json").is_file() and job["log"].is_file():
                job["proc"] = _Finished()  # a kept run of an interrupted sweep: evaluated, not retrained
                running.append(job)
                continue
            cmd = [
                *(sys.executable, "train.py", "--data", str(data), "--out", str(job["dir"])),
                *("--config", args.config, "--overwrite", f"seed={job['seed']}", *job["overrides"]),
            ]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(job["tree"]))
            with open(job["log"], "w") as log:
                job["proc"] = subprocess.Popen(cmd, cwd=job["tree"], env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append(job)
        time.sleep(1)
        for job in [j for j in running if j["proc"].poll() is not None]:
            running.remove(job)
            text = job["log"].read_text(errors="replace").replace("\r", "\n")
            row = dict(
                cell=job["cell"], seed=job["seed"], overrides=job["overrides"], returncode=job["proc"].returncode
            )
            init = [ln for ln in text.splitlines() if ln.startswith("init:")]
            row["init"] = init[-1][len("init:") :].strip() if init else None
            if job["proc"].returncode != 0:
                row["error"] = text.strip().splitlines()[-1] if text.strip() else "no output"
            else:
                metrics = json.loads((job["dir"] / "metrics.json").read_text())
                row.update(evaluate(job["dir"]))
                row["trainer_psnr"] = metrics.get("test.psnr")
                row["n_primitives"] = metrics.get("n_gaussians")
                row["train_seconds"] = metrics.get("train_seconds")
                row["depth_rel_err"] = metrics.get("test.depth_rel_err")  # None without ground truth
                row["normal_deg_err"] = metrics.get("test.normal_deg_err")
            runs.append(row)
            print({k: row.get(k) for k in ("cell", "seed", "psnr", "psnr_in_mask", "psnr_outside_mask", "error")},
                  file=sys.stderr, flush=True)  # fmt: skip
    summary = summarise(runs, cells)
    emit(
        dict(
            command=f"python bench/seeds.py {' '.join(sys.argv[1:])}",
            note=args.note,
            commit=commit(str(ROOT)),
            trees={tag: commit(str(t)) for tag, t in zip(tags, trees)},
            machine=machine(omp_num_threads=args.threads, jobs_at_once=args.jobs),
            config=args.config,
            table=table(summary, cells),
            summary=summary,
            runs=sorted(runs, key=lambda r: (cells.index(r["cell"]), r["seed"])),
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
