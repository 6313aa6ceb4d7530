"""Training quality guard: every config x every init mode on the shared
scenes, compared with the last stored run.  Run it before changing any
training default (init, losses, strategy, configs); see CONTRIBUTING.md.

::

    python bench/quality.py --shared ../shared                       # everything (hours on 2 CPU cores)
    python bench/quality.py --scenes still_life --configs fast default --inits auto points
    python bench/quality.py ... --baseline bench/results/quality_cpu.json --out bench/results/quality_cpu.json

Each run trains in a child process (so that its time and peak memory are
its own) and records test PSNR / SSIM (and inside the object masks,
``test.psnr_masked`` / ``test.ssim_masked``, where the test views have
``transforms.json`` masks, ``eval.masked``; null elsewhere: the scenes here
load without them), depth and normal error against the scene's ground truth
where it has one, surfels, training and wall seconds, peak memory and the
``init:`` line.  Then each (scene, config, init) that
the baseline also holds is compared: a PSNR drop of more than
:data:`MAX_PSNR_DROP_DB` or a depth error higher by more than
:data:`MAX_DEPTH_RISE` (1 percentage point) is flagged, and the exit code is
1 when anything is flagged.  The baseline is ``--baseline``, else the
newest ``bench/results/quality*.json``.

Scenes (folders under ``--shared``/scenes):

``still_life``  NeRF layout (15 test views with ground-truth depth and
                normals), so ``auto`` has no point cloud to start from;
                ``points`` mode uses the 4,000 points of its COLMAP model
                ``sparse/0`` (the same world frame).
``dtu_scan24``  COLMAP layout (34k SfM points), every 8th view held out.
``fox``         ``transforms.json``, no point cloud (``points`` is skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import add_child_flag, child_case, commit, emit, machine, print_child_result, run_child  # noqa: E402

SCENES = {
    "still_life": dict(layout="nerf", points_from="sparse/0"),
    "dtu_scan24": dict(layout="colmap", points_from=None),
    "fox": dict(layout="transforms", points_from=None),
}
CONFIGS = {"fast": "configs/fast.yaml", "default": "configs/default.yaml"}
INITS = ("points", "triangulate", "stereo", "random", "auto")
#: Flag a run whose test PSNR is this much below the baseline's (dB).
MAX_PSNR_DROP_DB = 0.5
#: Flag a run whose relative depth error is this much above the baseline's (1 percentage point).
MAX_DEPTH_RISE = 0.01
METRICS = (
    "test.psnr",
    "test.ssim",
    "test.psnr_masked",
    "test.ssim_masked",
    "test.depth_rel_err",
    "test.normal_deg_err",
    "n_gaussians",
    "train_seconds",
    "peak_memory_mb",
)


def run_one(
    scene_dir: Path, layout: str, points_from, config: str, init: str, out: Path, overrides, curve_every: int = 0
) -> dict:
    """Child process: train one run and return its record.

    ``curve_every`` > 0 also evaluates the test views every that many steps
    and records ``curve``: (step, seconds, psnr, depth error, normal error)
    rows, where seconds is the time since the trainer was built (the
    initialisation included) without the evaluations themselves, so a start
    is judged by the time it takes to reach a quality, not only by where it
    ends (issue 26)."""
    import torch

    from splat.config import load_config
    from splat.data import load_scene_from_config
    from splat.data.colmap import read_model
    from splat.trainer import Trainer

    cfg = load_config(
        str(ROOT / config),
        [f"data.path={scene_dir}", f"data.layout={layout}", f"model.init={init}", "log.progress=false", *overrides],
    )
    scene = load_scene_from_config(cfg["data"], eval_masks=cfg["eval"]["masked"] is not False)
    if init == "points" and points_from and scene.points is None:
        _, _, xyz, rgb, _ = read_model(scene_dir / points_from)
        scene.points = torch.from_numpy(xyz).float()
        scene.point_colors = torch.from_numpy(rgb).float() / 255.0
    curve, paused = [], [0.0]

    def record(trainer, step, _terms):
        if step % curve_every == 0 and step < trainer.cfg["train"]["iterations"]:
            t = time.perf_counter()
            m = trainer.evaluate()
            curve.append(_curve_row(step, t - t0 - paused[0], m))
            paused[0] += time.perf_counter() - t

    t0 = time.perf_counter()
    metrics = Trainer(cfg, out, scene=scene, callbacks=[record] if curve_every > 0 else ()).train()
    wall = time.perf_counter() - t0
    rec = dict(metrics={k: metrics.get(k) for k in METRICS}, wall_seconds=round(wall, 1))
    if curve_every > 0:
        # The final evaluation is part of wall; the last row is the trained model.
        curve.append(_curve_row(metrics["iterations"], wall - paused[0], metrics))
        rec["curve"] = curve
    return rec


def _curve_row(step: int, seconds: float, m: dict) -> list:
    return [step, round(seconds, 1), m.get("test.psnr"), m.get("test.depth_rel_err"), m.get("test.normal_deg_err")]


def time_to_reach(curve: list, psnr: float, depth_rel_err=None, normal_deg_err=None):
    """Seconds at the first ``curve`` row (see :func:`run_one`) at or above
    ``psnr`` and at or below the given errors, or None if no row is."""
    for _step, seconds, p, d, n in curve:
        if (
            p is not None
            and p >= psnr
            and (depth_rel_err is None or (d is not None and d <= depth_rel_err))
            and (normal_deg_err is None or (n is not None and n <= normal_deg_err))
        ):
            return seconds
    return None


def compare(runs: list, baseline: dict) -> list:
    """Flags (one line each) for runs that lost quality against the baseline's same run.

    Baseline runs marked ``"ablation": true`` (a config with an override,
    kept beside the real runs for the record) are not compared against, nor
    runs with other config overrides (``data.downscale=4``, ...)."""

    def key(r):
        return r["scene"], r["config"], r["init"], tuple(r.get("overrides") or ())

    old = {key(r): r for r in baseline.get("runs", []) if "metrics" in r and not r.get("ablation")}
    flags = []
    for r in runs:
        b = old.get(key(r))
        if b is None or "metrics" not in r:
            continue
        name = f"{r['scene']} {r['config']} init={r['init']}"
        p, pb = r["metrics"].get("test.psnr"), b["metrics"].get("test.psnr")
        if p is not None and pb is not None and p < pb - MAX_PSNR_DROP_DB:
            flags.append(f"{name}: test PSNR {p:.2f} dB, {pb - p:.2f} dB below the baseline's {pb:.2f}")
        d, db = r["metrics"].get("test.depth_rel_err"), b["metrics"].get("test.depth_rel_err")
        if d is not None and db is not None and d > db + MAX_DEPTH_RISE:
            flags.append(
                f"{name}: depth error {100 * d:.2f} %, above the baseline's {100 * db:.2f} % "
                f"by more than {100 * MAX_DEPTH_RISE:.0f} percentage point"
            )
    return flags


def _newest_baseline(exclude: Path, folder: Path = ROOT / "bench" / "results"):
    """The stored quality file with the latest ``date``, ties broken by name.

    Not the file time: a fresh clone gives every file the time of the
    checkout, in no particular order."""
    files = [p for p in folder.glob("quality*.json") if p.resolve() != exclude.resolve()]

    def key(p: Path):
        try:
            date = str(json.loads(p.read_text()).get("date", ""))
        except (OSError, ValueError):
            date = ""
        return date, p.name

    return max(files, key=key) if files else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding scenes/")
    ap.add_argument("--scenes", nargs="+", default=list(SCENES), choices=list(SCENES))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--inits", nargs="+", default=list(INITS), choices=list(INITS))
    ap.add_argument("--baseline", help="stored quality JSON to compare with (default: the newest)")
    ap.add_argument("--out", help="write the report here too (e.g. bench/results/quality_cpu.json)")
    ap.add_argument("--keep", help="keep the run folders under this folder (default: a temporary one)")
    ap.add_argument(
        "--curve",
        type=int,
        default=0,
        metavar="N",
        help="also evaluate the test views every N steps and record the quality over time",
    )
    ap.add_argument("overrides", nargs="*", help="config overrides key=value applied to every run")
    add_child_flag(ap)
    args = ap.parse_args(argv)

    case = child_case(args)
    if case is not None:
        rec = run_one(
            Path(case["scene_dir"]),
            case["layout"],
            case["points_from"],
            case["config"],
            case["init"],
            Path(case["out"]),
            args.overrides,
            args.curve,
        )
        print_child_result(rec)
        return 0

    shared = Path(args.shared)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="splat_quality_"))
    runs = []
    for scene in args.scenes:
        spec = SCENES[scene]
        scene_dir = shared / "scenes" / scene
        if not scene_dir.is_dir():
            print(f"error: {scene_dir}: scene not found (--shared)", file=sys.stderr)
            return 2
        for config in args.configs:
            for init in args.inits:
                rec = dict(scene=scene, layout=spec["layout"], config=config, init=init, overrides=list(args.overrides))
                if init == "points" and spec["points_from"] is None and spec["layout"] == "transforms":
                    rec["skipped"] = "no point cloud"
                    runs.append(rec)
                    continue
                out = work / f"{scene}_{config}_{init}"
                case = dict(
                    scene_dir=str(scene_dir),
                    layout=spec["layout"],
                    points_from=spec["points_from"],
                    config=CONFIGS[config],
                    init=init,
                    out=str(out),
                )
                print(f"== {scene} {config} init={init}", file=sys.stderr, flush=True)
                result, proc = run_child(__file__, case, ["--curve", args.curve, *args.overrides], cwd=ROOT)
                init_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("init: ")]
                rec["init_line"] = init_lines[-1] if init_lines else None
                if result is None:
                    rec["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                else:
                    rec.update(result)
                print(f"   {json.dumps(rec)}", file=sys.stderr, flush=True)
                runs.append(rec)

    out_path = Path(args.out) if args.out else ROOT / "bench" / "results" / "quality_new.json"
    base_path = Path(args.baseline) if args.baseline else _newest_baseline(out_path)
    baseline = json.loads(base_path.read_text()) if base_path and base_path.is_file() else {}
    flags = compare(runs, baseline)
    report = dict(
        benchmark="quality",
        machine=machine(),
        commit=commit(str(ROOT)),
        date=time.strftime("%Y-%m-%d"),
        command="python bench/quality.py " + " ".join(sys.argv[1:] if argv is None else argv),
        thresholds=dict(max_psnr_drop_db=MAX_PSNR_DROP_DB, max_depth_rise=MAX_DEPTH_RISE),
        baseline=str(base_path.resolve().relative_to(ROOT)) if base_path and base_path.is_file() else None,
        flags=flags,
        runs=runs,
    )
    emit(report, args.out)
    for f in flags:
        print(f"FLAG {f}", file=sys.stderr)
    return 1 if flags or any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
