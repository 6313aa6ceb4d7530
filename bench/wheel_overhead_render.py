"""splat.rasterize forward and backward through the C ABI (ctypes,
splat/_native.py) against the same kernels in a torch extension (splat._C),
alternating call by call in ONE process (the autograd routed to one build or
the other), float32.  Prints JSON (and writes it with --out): median and
minimum ms per build, and the median over pairs of new/old.

    python bench/wheel_overhead_render.py EXT/_C.so N SIZE REPS [--out FILE]

EXT/_C.so: the torch extension of this tree's kernels (how to build it:
bench/wheel_overhead_step.py), or of an older tree whose op signatures match.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import wheel_bitwise as w  # noqa: E402
from report import commit, emit, machine  # noqa: E402

import splat  # noqa: E402
from splat.testing import surface_scene  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("extension")
ap.add_argument("n", type=int)
ap.add_argument("size", type=int)
ap.add_argument("reps", type=int)
ap.add_argument("--out")
args = ap.parse_args()
old, new = w.load_old(args.extension), w.kernels()
s = surface_scene(args.n, args.size, args.size, dtype=torch.float32, seed=0)
params = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
t = {"torch_extension": ([], []), "c_abi": ([], [])}
for rep in range(args.reps + 2):
    builds = (("torch_extension", old), ("c_abi", new))
    for name, ext in builds if rep % 2 else builds[::-1]:
        w.use(ext)
        t0 = time.perf_counter()
        out = splat.rasterize(**{**s, **params}, backend="cpu")
        t1 = time.perf_counter()
        (out.rgb.sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum() + out.median_depth.sum()).backward()
        t2 = time.perf_counter()
        if rep >= 2:  # two warm-up pairs
            t[name][0].append(1e3 * (t1 - t0))
            t[name][1].append(1e3 * (t2 - t1))
result = {}
for name, (fwd, bwd) in t.items():
    result[name] = {
        "fwd_median": round(statistics.median(fwd), 3),
        "fwd_min": round(min(fwd), 3),
        "bwd_median": round(statistics.median(bwd), 3),
        "bwd_min": round(min(bwd), 3),
    }
(of, ob), (nf, nb) = t["torch_extension"], t["c_abi"]
result["c_abi_over_extension"] = {
    "fwd_median_of_pair_ratios": round(statistics.median(b / a for a, b in zip(of, nf)), 4),
    "bwd_median_of_pair_ratios": round(statistics.median(b / a for a, b in zip(ob, nb)), 4),
    "total_median_of_pair_ratios": round(
        statistics.median((b1 + b2) / (a1 + a2) for a1, a2, b1, b2 in zip(of, ob, nf, nb)), 4
    ),
}
emit(
    {
        "benchmark": "wheel_overhead_render",
        "commit": commit(str(ROOT)),
        "machine": machine(),
        "command": "python bench/wheel_overhead_render.py " + " ".join(sys.argv[1:]),
        "surfels": args.n,
        "size": args.size,
        "reps": args.reps,
        "threads": torch.get_num_threads(),
        "ms_per_call": result,
    },
    args.out,
)
