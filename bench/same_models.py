"""Bitwise guard for a change that must not change any model (a
restructure, a rename, formatting): trains fixed runs with the code of one
or more source trees and prints the SHA-256 of each ``point_cloud.ply``.

::

    python bench/same_models.py --shared ../shared                       # this tree
    python bench/same_models.py --shared ../shared --roots /tmp/old .    # old against new, one run
    python bench/same_models.py --runs tiny fast --out bench/results/same_models.json

Runs:

``fast``, ``default``  still_life (NeRF layout, auto init, seed 0) with
                       ``configs/fast.yaml`` / ``configs/default.yaml``
``tiny``               the invariance config of tests/test_distributed_train.py
                       on its generated scene, on 1, 2 and 3 processes

Each tree runs in a child process with ``PYTHONPATH`` at its root, so its
own splat (and compiled kernels: build each tree first) is imported.  Exit
code 1 when two trees disagree on any run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from report import add_child_flag, child_case, commit, emit, machine, print_child_result, run_child  # noqa: E402

RUNS = ("fast", "default", "tiny")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_tree(root: Path, shared: Path, runs, out: Path) -> dict:
    """Child process: every run of ``runs`` with the splat at ``root``."""
    sys.path[:0] = [str(root), str(root / "tests")]
    import splat

    assert Path(splat.__file__).resolve().is_relative_to(root), splat.__file__
    from splat.config import load_config
    from splat.trainer import Trainer

    result = {}
    for name in runs:
        if name in ("fast", "default"):
            cfg = load_config(
                str(root / "configs" / f"{name}.yaml"),
                [
                    f"data.path={shared / 'scenes' / 'still_life'}",
                    "data.layout=nerf",
                    "model.init=auto",
                    "seed=0",
                    "log.progress=false",
                ],
            )
            metrics = Trainer(cfg, out / name, overwrite=True).train()
            result[name] = dict(
                sha256=_sha(out / name / "point_cloud.ply"),
                psnr=metrics["test.psnr"],
                n_gaussians=metrics["n_gaussians"],
            )
        else:
            import test_distributed_train as t

            scene = t.make_tiny_scene(out / "tiny_scene")
            for world in (1, 2, 3):
                run_dir = out / f"tiny{world}" / "run"
                t.run(world, t.config(scene), run_dir)
                result[f"tiny{world}"] = dict(sha256=_sha(run_dir / "point_cloud.ply"))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding scenes/still_life")
    ap.add_argument("--roots", nargs="+", default=[str(ROOT)], help="source trees to compare (default: this one)")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    add_child_flag(ap)
    args = ap.parse_args(argv)
    case = child_case(args)
    if case is not None:
        print_child_result(run_tree(Path(case["root"]), Path(case["shared"]), case["runs"], Path(case["out"])))
        return 0
    trees = {}
    for root in args.roots:
        root = Path(root).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            case = dict(root=str(root), shared=str(Path(args.shared).resolve()), runs=args.runs, out=tmp)
            env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS=str(args.threads))
            result, proc = run_child(__file__, case, env=env)
        if result is None:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"{root}: the runs failed")
        trees[str(root)] = dict(commit=commit(str(root)), runs=result)
    shas = [{k: v["sha256"] for k, v in t["runs"].items()} for t in trees.values()]
    same = all(s == shas[0] for s in shas)
    emit(dict(benchmark="same_models", machine=machine(threads=args.threads), trees=trees, same=same), args.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
