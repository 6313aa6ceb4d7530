"""Kill-and-resume soak: train, SIGKILL the trainer at random moments (some of
them while it writes a checkpoint), resume each time, and check that the
final model is BITWISE equal to an uninterrupted run's and that no kill lost
more than one checkpoint interval.

    python scripts/kill_resume_soak.py [--kills 8] [--iterations 300] [--every 20] [--out RESULT.json]

It trains the bundled sample scene (data/sample_scene, 64x64) with
`train.py` in subprocesses: one uninterrupted reference run, and one run that
is killed `--kills` times.  Each kill is either at a random moment or, for
every other kill, as soon as a checkpoint temp file (`.ckpt_*.tmpPID`)
appears, i.e. during the write.  After each kill the script records the
newest valid checkpoint's step against the step the trainer had announced
(a kill may lose at most the steps since the last checkpoint), then resumes
with `train.py --out OUT --resume`.  About 2 min on the 2-core machine,
so it is a script, not a test (tests/test_train.py has the one-kill version).
Exit status 0 only if every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import portable  # noqa: E402  (results name no folder of this machine)


def train_cmd(out: Path, args, *extra):
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "--out",
        str(out),
        "--config",
        str(ROOT / "configs" / "fast.yaml"),
        "--data",
        str(ROOT / "data" / "sample_scene"),
        "--iterations",
        str(args.iterations),
        "--no-progress",
        f"checkpoint.every={args.every}",
        "checkpoint.keep=2",
        f"seed={args.seed}",
        *extra,
    ]


def checkpoint_steps(ckpt_dir: Path):
    """Steps of the complete checkpoint files (names ckpt_<step>_<run>.pt), without loading them."""
    if not ckpt_dir.is_dir():
        return []
    return [int(m.group(1)) for p in ckpt_dir.iterdir() if (m := re.match(r"ckpt_(\d+)_", p.name))]


def newest_step(out: Path):
    from splat.checkpoints import load_latest_checkpoint

    ckpt = load_latest_checkpoint(out)
    return None if ckpt is None else int(ckpt["step"])


def final_params(out: Path):
    from splat.checkpoints import load_latest_checkpoint

    return load_latest_checkpoint(out)["params"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--every", type=int, default=20, help="checkpoint.every")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rng", type=int, default=1, help="seed of the kill schedule")
    ap.add_argument("--out", help="write the JSON result here too")
    args = ap.parse_args()
    rng = random.Random(args.rng)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp(prefix="splat_soak_"))
    full, killed = work / "full", work / "killed"

    t0 = time.perf_counter()
    subprocess.run(train_cmd(full, args), env=env, check=True, capture_output=True)
    reference_seconds = time.perf_counter() - t0
    interval_seconds = reference_seconds / args.iterations * args.every  # rough: start-up included

    kills, resumes = [], 0
    first = True
    while len(kills) < args.kills:
        cmd = train_cmd(killed, args, *([] if first else ["--resume"]))
        first = False
        before = newest_step(killed) if killed.exists() else None
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        during_write = len(kills) % 2 == 1
        ckpt_dir = killed / "checkpoints"
        # Every kill waits for progress first (a checkpoint newer than the one
        # this incarnation started from), so the run always moves on; then a
        # random kill waits a random fraction of a checkpoint interval more,
        # and a write kill waits for the next checkpoint's temp file.
        hit_write = False
        start_step = before or 0
        deadline = time.time() + 300
        progressed_at = None
        while time.time() < deadline and proc.poll() is None:
            steps = checkpoint_steps(ckpt_dir)
            if progressed_at is None and steps and max(steps) > start_step:
                progressed_at = time.time()
                extra = rng.uniform(0.0, 1.0) * interval_seconds
            if progressed_at is not None:
                if during_write and any(p.name.startswith(".ckpt_") for p in ckpt_dir.iterdir()):
                    hit_write = True
                    break
                if not during_write and time.time() - progressed_at >= extra:
                    break
            time.sleep(0.0005 if during_write else 0.005)
        if proc.poll() is not None:
            if proc.returncode != 0:
                raise SystemExit(f"error: the trainer failed (exit {proc.returncode}): {' '.join(cmd)}")
            break  # finished before the kill: the run is complete
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        temp_left = ckpt_dir.is_dir() and any(p.name.startswith(".ckpt_") for p in ckpt_dir.iterdir())
        after = newest_step(killed)
        kills.append(
            dict(
                mode="during checkpoint write" if during_write else "random",
                temp_file_seen=hit_write,
                temp_file_left_by_kill=bool(temp_left),
                checkpoint_step_before=before,
                checkpoint_step_after=after,
            )
        )
        print(f"kill {len(kills)}: {kills[-1]}", flush=True)
    # Finish the run.
    while True:
        res = subprocess.run(train_cmd(killed, args, "--resume"), env=env, capture_output=True, text=True)
        resumes += 1
        if res.returncode != 0:
            raise SystemExit(f"error: resume failed: {res.stderr.strip().splitlines()[-1:]}")
        if (killed / "metrics.json").exists():
            break

    import torch

    a, b = final_params(full), final_params(killed)
    bitwise = sorted(a) == sorted(b) and all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)
    metrics_a = json.loads((full / "metrics.json").read_text())
    metrics_b = json.loads((killed / "metrics.json").read_text())
    # A kill loses at most one interval: the newest valid checkpoint after a
    # kill is never older than the one before it (nothing valid was deleted).
    never_lost_a_checkpoint = all(
        k["checkpoint_step_after"] is None
        and k["checkpoint_step_before"] is None
        or (k["checkpoint_step_after"] or 0) >= (k["checkpoint_step_before"] or 0)
        for k in kills
    )
    result = dict(
        command=" ".join(["python", "scripts/kill_resume_soak.py"] + sys.argv[1:]),
        iterations=args.iterations,
        checkpoint_every=args.every,
        kills=kills,
        kills_during_write=sum(k["temp_file_seen"] for k in kills),
        final_params_bitwise_equal=bitwise,
        test_psnr=dict(uninterrupted=metrics_a["test"]["psnr"], killed_and_resumed=metrics_b["test"]["psnr"]),
        n_gaussians=dict(uninterrupted=metrics_a.get("n_gaussians"), killed_and_resumed=metrics_b.get("n_gaussians")),
        never_lost_a_checkpoint=never_lost_a_checkpoint,
        reference_seconds=round(reference_seconds, 1),
    )
    shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(portable(result), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    ok = bitwise and never_lost_a_checkpoint and len(kills) == args.kills
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
