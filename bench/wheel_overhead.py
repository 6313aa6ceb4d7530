"""Per-call overhead of the C-ABI kernels (ctypes, splat/_native.py) against
the former torch extension (splat._C), side by side in one run: each case
runs in child processes that alternate between the two code trees (each with
its own kernels built in place), so both see the same machine load.  Prints
JSON (and writes it with --out).  Not a test: numbers depend on the machine.

    python bench/wheel_overhead.py --roots OLD_TREE . --out bench/results/wheel_overhead.json

Cases: bench/rasterize.py's forward and backward (surfels and 3D Gaussians)
at 10k surfels / 128 x 128 and 100k / 512 x 512, and a tiny call (100
surfels, 16 x 16) whose time is almost all per-call overhead.  With
--train-step, bench/train_step.py --roots OLD NEW (its own alternation) is run
and merged in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CASES = [(100, 16, 16, 40), (10_000, 128, 128, 10), (100_000, 512, 512, 2)]

CHILD = """
import json, statistics, sys, time
sys.path[:0] = [{root!r}, {bench!r}]
import torch, splat
assert splat.__file__.startswith({root!r}), splat.__file__
from rasterize import THIRD_SCALE
from splat.rasterize_3dgs import rasterize_3dgs
from splat.testing import surface_scene

res = {{}}
for prim in ("2dgs", "3dgs"):
    scene = surface_scene({n}, {w}, {h}, dtype=torch.float32, seed=0)
    render = splat.rasterize
    if prim == "3dgs":
        s = scene["scales"]
        scene["scales"] = torch.cat([s, THIRD_SCALE * s.amin(-1, keepdim=True)], -1)
        render = rasterize_3dgs
    params = {{k: scene[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}}
    fwd, bwd = [], []
    for rep in range({reps} + 1):  # the first call warms up
        t0 = time.perf_counter()
        out = render(**{{**scene, **params}}, backend="cpu")
        t1 = time.perf_counter()
        loss = out.rgb.sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum() + out.median_depth.sum()
        loss.backward()
        t2 = time.perf_counter()
        if rep:
            fwd.append(1e3 * (t1 - t0))
            bwd.append(1e3 * (t2 - t1))
    res[prim] = (statistics.median(fwd), statistics.median(bwd))
print("RESULT" + json.dumps(res))
"""


def child(root: Path, n, w, h, reps, threads):
    code = CHILD.format(root=str(root), bench=str(HERE), n=n, w=w, h=h, reps=reps)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.split("RESULT", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roots", nargs=2, required=True, help="old tree, new tree")
    parser.add_argument("--alternations", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-step", action="store_true", help="also run bench/train_step.py --roots OLD NEW")
    parser.add_argument("--data", help="train_step.py --data (a COLMAP scene)")
    parser.add_argument("--out")
    args = parser.parse_args()
    roots = [Path(r).resolve() for r in args.roots]
    rows = []
    for n, w, h, reps in CASES:
        samples = {label: {"2dgs": ([], []), "3dgs": ([], [])} for label in ("old", "new")}
        for _ in range(args.alternations):
            for label, root in zip(("old", "new"), roots):
                res = child(root, n, w, h, reps, args.threads)
                for prim, (f, b) in res.items():
                    samples[label][prim][0].append(f)
                    samples[label][prim][1].append(b)
        for prim in ("2dgs", "3dgs"):
            med = {r: [statistics.median(samples[r][prim][k]) for k in (0, 1)] for r in samples}
            old, new = med["old"], med["new"]
            rows.append(
                {
                    "surfels": n, "width": w, "height": h, "primitive": prim,
                    "old_forward_ms": old[0], "new_forward_ms": new[0],
                    "old_backward_ms": old[1], "new_backward_ms": new[1],
                    "forward_ratio": new[0] / old[0], "backward_ratio": new[1] / old[1],
                    "samples": {r: samples[r][prim] for r in samples},
                }
            )  # fmt: skip
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "samples"}), flush=True)
    result = {
        "what": "forward/backward ms per call (median over alternating child processes), old splat._C vs C ABI",
        "command": f"python bench/wheel_overhead.py --roots OLD NEW --alternations {args.alternations} "
        f"--threads {args.threads}" + (" --train-step --data SHARED/scenes/dtu_scan24" if args.train_step else ""),
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    if args.train_step:
        cmd = [sys.executable, str(HERE / "train_step.py"), "--roots", *map(str, roots), "--threads", str(args.threads)]
        if args.data:
            cmd += ["--data", args.data]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        result["train_step"] = json.loads(out[out.index("{") :])
        result["train_step_command"] = f"python bench/train_step.py --roots OLD NEW --threads {args.threads} --data DTU"
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
