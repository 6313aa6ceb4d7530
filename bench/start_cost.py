"""What a start costs per step: forward + backward milliseconds per training
view of each initialisation mode's *initial* model, and its size (issue 26,
item 3: a sparse cloud's initial surfels must not be huge, so its first steps
must not be slower than a dense start's).  Prints JSON (and writes it with
--out).  Not a test: numbers depend on the machine and its load.

    python bench/start_cost.py --shared ../shared --out bench/results/start_cost_still_life.json

Each mode runs in the same process one after the other, at ``--threads``
threads, over every ``--every``-th training view, best of two passes (the
first warms the caches).  Scenes as bench/quality.py (still_life: the NeRF
layout; ``points`` uses its COLMAP model's 4,000 points).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from quality import CONFIGS, INITS, SCENES  # noqa: E402
from report import commit, emit, machine  # noqa: E402


def start_cost(scene_dir: Path, scene: str, config: str, init: str, every: int) -> dict:
    import torch

    from splat.config import load_config
    from splat.data import load_scene_from_config
    from splat.data.colmap import read_model
    from splat.trainer import Trainer

    spec = SCENES[scene]
    cfg = load_config(
        str(ROOT / CONFIGS[config]),
        [f"data.path={scene_dir}", f"data.layout={spec['layout']}", f"model.init={init}", "log.progress=false"],
    )
    data = load_scene_from_config(cfg["data"])
    if init == "points" and spec["points_from"] and data.points is None:
        _, _, xyz, rgb, _ = read_model(scene_dir / spec["points_from"])
        data.points, data.point_colors = torch.from_numpy(xyz).float(), torch.from_numpy(rgb).float() / 255.0
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        trainer = Trainer(cfg, out, scene=data)
        init_seconds = time.perf_counter() - t0
        frames = trainer.scene.train[::every]
        for p in trainer.model.params.values():
            p.requires_grad_(True)
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            for f in frames:
                trainer.render(f).rgb.sum().backward()
            best = min(best, (time.perf_counter() - t) / len(frames))
        n = trainer.model.num_gaussians
        trainer.close()
    return dict(
        scene=scene,
        config=config,
        init=init,
        primitives=n,
        views=len(frames),
        ms_per_view_forward_backward=round(1e3 * best, 1),
        init_seconds=round(init_seconds, 1),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding scenes/")
    ap.add_argument("--scene", default="still_life", choices=list(SCENES))
    ap.add_argument("--config", default="default", choices=list(CONFIGS))
    ap.add_argument("--inits", nargs="+", default=list(INITS), choices=list(INITS))
    ap.add_argument("--every", type=int, default=3, help="every N-th training view")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    scene_dir = Path(args.shared) / "scenes" / args.scene
    if not scene_dir.is_dir():
        print(f"error: {scene_dir}: scene not found (--shared)", file=sys.stderr)
        return 2
    results = []
    for init in args.inits:
        results.append(start_cost(scene_dir, args.scene, args.config, init, args.every))
        print(results[-1], file=sys.stderr, flush=True)
    emit(
        dict(
            benchmark="start cost",
            machine=machine(),
            commit=commit(str(ROOT)),
            date=time.strftime("%Y-%m-%d"),
            command="python bench/start_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
            threads=args.threads,
            results=results,
        ),
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
