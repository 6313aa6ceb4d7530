"""Per-call cost of the C-ABI kernels against the former torch extension,
both loaded in ONE process and called alternately on the same inputs (the
order flips every repetition), so machine load hits both alike.  Prints JSON
(and writes it with --out).  Not a test: numbers depend on the machine.

    python bench/wheel_overhead_inprocess.py --old-extension OLD/splat/_C.cpython-311-x86_64-linux-gnu.so \\
        --out bench/results/wheel_overhead_inprocess.json

Ops: the projection, the surfel rasterizer forward and backward (with its
packed records) and the 3D Gaussian rasterizer forward and backward, at 100
surfels / 16 x 16 (almost all per-call overhead), 10k / 128 x 128 and 100k /
512 x 512 (bench/rasterize.py's scenes).
Reports the median and the minimum per op; ratio = new / old.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from wheel_bitwise import kernels, load_old, rasterize_mod  # noqa: E402

from splat.testing import surface_scene  # noqa: E402


def op_calls(ext, n, size):
    """name -> zero-argument callable, for one build."""
    s = surface_scene(n, size, size, dtype=torch.float32, seed=0)
    lim = rasterize_mod._magnitude_limits(torch.float32)
    image = (size, size, 0.2, 100.0)
    pargs = (s["means"], s["quats"], s["scales"], s["opacities"], torch.empty(0), 0, s["viewmat"], s["K"])
    proj = ext.project_forward_cpu(*pargs, *image, *lim)
    ins = (proj[0], proj[1], proj[2], s["colors"], s["opacities"], proj[4], proj[5])
    up = [torch.ones(size, size, 3), torch.ones(size, size), torch.ones(size, size)] * 2
    up[3] = torch.ones(size, size, 3)
    f = ext.forward_cpu(*ins, *image)
    state = [f[9], f[10], f[6], f[7], f[1], f[8]]
    g = torch.Generator().manual_seed(0)
    params = torch.randn(n, ext.gauss_params_size, generator=g) * 0.01
    gin = (params, s["colors"], proj[4], proj[5])
    gf = ext.forward_gaussians_cpu(*gin, *image)
    gstate = [gf[9], gf[10], gf[6], gf[7], gf[1], gf[8]]
    v = [torch.ones(n, c) for c in (9, 2, 3, 3)]
    return {
        "project_forward": lambda: ext.project_forward_cpu(*pargs, *image, *lim),
        "project_backward": lambda: ext.project_backward_cpu(*pargs, *image, *v),
        "surfel_forward": lambda: ext.forward_cpu(*ins, *image),
        "surfel_backward": lambda: ext.backward_cpu(*ins, *image, *state, *up, f[11]),
        "gaussian_forward": lambda: ext.forward_gaussians_cpu(*gin, *image),
        "gaussian_backward": lambda: ext.backward_gaussians_cpu(*gin, *image, *gstate, *up),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-extension", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    builds = {"old": load_old(args.old_extension), "new": kernels()}
    rows = []
    cases = ((100, 16, 10 * args.reps), (10_000, 128, args.reps), (100_000, 512, max(4, args.reps // 5)))
    for n, size, reps in cases:
        calls = {name: op_calls(ext, n, size) for name, ext in builds.items()}
        for op in calls["old"]:
            times = {"old": [], "new": []}
            for rep in range(reps + 1):
                order = ("old", "new") if rep % 2 else ("new", "old")
                for name in order:
                    t = time.perf_counter()
                    calls[name][op]()
                    if rep:
                        times[name].append(1e3 * (time.perf_counter() - t))
            med = {k: statistics.median(x) for k, x in times.items()}
            low = {k: min(x) for k, x in times.items()}
            rows.append(
                {
                    "op": op, "surfels": n, "size": size, "reps": reps,
                    "old_median_ms": round(med["old"], 4), "new_median_ms": round(med["new"], 4),
                    "median_ratio": round(med["new"] / med["old"], 4),
                    "old_min_ms": round(low["old"], 4), "new_min_ms": round(low["new"], 4),
                    "min_ratio": round(low["new"] / low["old"], 4),
                }
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    import os

    result = {
        "what": "kernel ops, old splat._C vs the C ABI (ctypes), alternating calls in one process, float32",
        "command": "python bench/wheel_overhead_inprocess.py --old-extension OLD/splat/_C*.so " + f"--reps {args.reps}",
        "threads": torch.get_num_threads(),
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
