"""splat.rasterize forward and backward, the old splat._C and the C ABI
alternating in ONE process (the autograd routed to one build or the other),
float32.  Prints the median and minimum ms per build.

    python bench/wheel_overhead_render.py OLD/splat/_C*.so N SIZE REPS
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import wheel_bitwise as w  # noqa: E402

import splat  # noqa: E402
from splat.testing import surface_scene  # noqa: E402

old, new = w.load_old(sys.argv[1]), w.kernels()
n, S, reps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = surface_scene(n, S, S, dtype=torch.float32, seed=0)
params = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
t = {"old": ([], []), "new": ([], [])}
for rep in range(reps + 1):
    for name, ext in (("old", old), ("new", new)) if rep % 2 else (("new", new), ("old", old)):
        w.use(ext)
        t0 = time.perf_counter()
        out = splat.rasterize(**{**s, **params}, backend="cpu")
        t1 = time.perf_counter()
        (out.rgb.sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum() + out.median_depth.sum()).backward()
        t2 = time.perf_counter()
        if rep:
            t[name][0].append(t1 - t0)
            t[name][1].append(t2 - t1)
for name in t:
    fwd, bwd = (1e3 * statistics.median(x) for x in t[name]), (1e3 * min(x) for x in t[name])
    (fwd_med, bwd_med), (fwd_min, bwd_min) = fwd, bwd
    print(f"{name} render fwd ms median {fwd_med:.3f} min {fwd_min:.3f} | bwd median {bwd_med:.3f} min {bwd_min:.3f}")
