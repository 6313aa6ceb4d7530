"""Bitwise guard for a change that must not change any model (a
restructure, a rename, formatting): trains fixed runs with the code of one
or more source trees and prints the SHA-256 of each ``point_cloud.ply``.

::

    python bench/same_models.py --shared ../shared                       # this tree
    python bench/same_models.py --shared ../shared --roots /tmp/old .    # old against new, one run
    python bench/same_models.py --runs tiny fast --out bench/results/same_models.json
    python bench/same_models.py --runs tiny --override model.primitive=3dgs --worlds 1 --roots /tmp/old .

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


def run_tree(root: Path, shared: Path, runs, out: Path, overrides=(), worlds=(1, 2, 3)) -> dict:
    """Child process: every run of ``runs`` with the splat at ``root``, each
    with the config ``overrides`` (KEY=VALUE) added; ``tiny`` on each number
    of processes in ``worlds``."""
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
                    *overrides,
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
            for world in worlds:
                run_dir = out / f"tiny{world}" / "run"
                t.run(world, t.config(scene, extra=overrides), run_dir)
                result[f"tiny{world}"] = dict(sha256=_sha(run_dir / "point_cloud.ply"))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding scenes/still_life")
    ap.add_argument("--roots", nargs="+", default=[str(ROOT)], help="source trees to compare (default: this one)")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides, every run")
    ap.add_argument(
        "--worlds", nargs="+", type=int, default=[1, 2, 3], help="processes of the tiny run (3D Gaussians: 1 only)"
    )
    ap.add_argument("--out", default=None)
    add_child_flag(ap)
    args = ap.parse_args(argv)
    case = child_case(args)
    if case is not None:
        runs = case["runs"]
        print_child_result(
            run_tree(
                Path(case["root"]),
                Path(case["shared"]),
                runs,
                Path(case["out"]),
                case.get("overrides", []),
                case.get("worlds", [1, 2, 3]),
            )
        )
        return 0
    trees = {}
    for root in args.roots:
        root = Path(root).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            shared = str(Path(args.shared).resolve())
            case = dict(
                root=str(root), shared=shared, runs=args.runs, out=tmp, overrides=args.override, worlds=args.worlds
            )
            env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS=str(args.threads))
            result, proc = run_child(__file__, case, env=env)
        if result is None:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"{root}: the runs failed")
        trees[str(root)] = dict(commit=commit(str(root)), runs=result)
    shas = [{k: v["sha256"] for k, v in t["runs"].items()} for t in trees.values()]
    same = all(s == shas[0] for s in shas)
    report = dict(benchmark="same_models", machine=machine(threads=args.threads), overrides=args.override)
    emit(dict(report, trees=trees, same=same), args.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
