"""Rasterizer benchmark: forward/backward milliseconds, pixel-surfel pairs per
second and peak memory, per backend and scene size.  Prints JSON (and writes
it with --out).  Not a test: numbers depend on the machine and its load.

    python bench/rasterize.py                      # CPU machine: cpu vs torch reference
    python bench/rasterize.py --out bench/results/cpu.json
    python bench/rasterize.py --case 10000,128,128 --case 100000,512,512 --roots OLD NEW

forward_ms / backward_ms time the whole render (projection, kernels,
composition); kernel_forward_ms / kernel_backward_ms the rasterizer's
autograd Function alone (binning, tile kernels and their buffers).

--case runs the given CPU cases (surfels and 3D Gaussians) instead of the
default list; --roots times the kernels of several source trees (each with
its built splat/_C*.so), case by case in turn, so that machine load falls on
all of them alike.

Surfels (splat.rasterize) and, in the "3dgs" rows, 3D Gaussians
(splat.rasterize_3dgs) on the same scene.  CUDA rows run only where a GPU is.

Each case runs in its own subprocess so that peak memory (ru_maxrss, or CUDA
max allocated) belongs to that case alone.  Scenes come from
splat.testing.surface_scene: surfels tangent to a ground plane and four
spheres, with trained-model-like sizes and opacities.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

from report import add_child_flag, child_case, emit, machine, print_child_result, run_child

CASES = [
    # (surfels, width, height, backends, repetitions, primitive)
    (20_000, 256, 256, ("cpu", "torch"), 3, "2dgs"),
    (20_000, 256, 256, ("cpu",), 3, "3dgs"),
    (100_000, 512, 512, ("cpu",), 3, "2dgs"),
    (100_000, 512, 512, ("cpu",), 3, "3dgs"),
    (1_000_000, 256, 256, ("cpu",), 1, "2dgs"),
    (1_000_000, 1920, 1080, ("cuda",), 5, "2dgs"),
    (1_000_000, 1920, 1080, ("cuda",), 5, "3dgs"),
]
#: The 3D Gaussians of a "3dgs" case: the same scene's surfels given a third
#: scale, this fraction of the smaller tangent one (trained 3DGS models on
#: surfaces are flat like that), so both primitives cover the same pixels.
THIRD_SCALE = 0.3


def _time_raster_functions(primitive, sync):
    """Times the rasterizer's autograd Function (binning, tile kernels and
    their buffers; not the projection nor the composition) in this process:
    returns lists the renders fill, kernel_forward_ms and kernel_backward_ms."""
    from splat.rasterize import _RasterizeSurfels
    from splat.rasterize_3dgs import _RasterizeGaussians

    fn = _RasterizeGaussians if primitive == "3dgs" else _RasterizeSurfels
    times = {"kernel_forward_ms": [], "kernel_backward_ms": []}

    def timed(f, key):
        def wrapper(ctx, *args):
            sync()
            t = time.perf_counter()
            r = f(ctx, *args)
            sync()
            times[key].append(time.perf_counter() - t)
            return r

        return staticmethod(wrapper)

    fn.forward = timed(fn.forward, "kernel_forward_ms")
    fn.backward = timed(fn.backward, "kernel_backward_ms")
    return times


def run_case(n, width, height, backend, reps, primitive="2dgs"):
    import torch

    import splat
    from splat._backend import load_extension
    from splat.rasterize import _project
    from splat.rasterize_3dgs import gaussian_kernel_inputs, rasterize_3dgs
    from splat.testing import surface_scene

    device = "cuda" if backend == "cuda" else "cpu"
    scene = surface_scene(n, width, height, dtype=torch.float32, seed=0)
    scene = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}
    render = splat.rasterize
    if primitive == "3dgs":
        s = scene["scales"]
        scene["scales"] = torch.cat([s, THIRD_SCALE * s.amin(-1, keepdim=True)], -1)
        render = rasterize_3dgs
    params = {k: scene[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    kernel_times = _time_raster_functions(primitive, sync)
    fwd, bwd = [], []
    for rep in range(reps + 1):  # the first run warms up (JIT, allocator, caches)
        sync()
        t0 = time.perf_counter()
        out = render(**{**scene, **params}, backend=backend)
        sync()
        t1 = time.perf_counter()
        loss = out.rgb.sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum() + out.median_depth.sum()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if rep:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    # pixel-surfel pairs the forward pass evaluates (list positions walked per pixel)
    pairs = None
    if backend in ("cpu", "cuda") and primitive == "3dgs":
        ext = load_extension()
        with torch.no_grad():
            kin = gaussian_kernel_inputs(
                scene["means"],
                scene["quats"],
                scene["scales"],
                scene["opacities"],
                scene["viewmat"],
                scene["K"],
                width,
                height,
                0.2,
                100.0,
            )
            f = ext.forward_gaussians_cuda if device == "cuda" else ext.forward_gaussians_cpu
            res = f(
                kin["params"],
                scene["colors"][kin["ids"]].contiguous(),
                kin["depth"],
                kin["pixel_rect"],
                width,
                height,
                0.2,
                100.0,
            )
            pairs = int(res[6].long().sum())
            tile_pairs = int(res[10].numel())
    elif backend in ("cpu", "cuda"):
        ext = load_extension()
        with torch.no_grad():
            p = _project(
                scene["means"],
                scene["quats"],
                scene["scales"],
                scene["opacities"],
                scene["viewmat"],
                scene["K"],
                width,
                height,
                0.2,
                100.0,
            )
            f = ext.forward_cuda if device == "cuda" else ext.forward_cpu
            res = f(
                p["Tuvw"].contiguous(),
                p["center"].contiguous(),
                p["normal"].contiguous(),
                scene["colors"],
                scene["opacities"],
                p["depth"],
                p["pixel_rect"],
                width,
                height,
                0.2,
                100.0,
            )
            pairs = int(res[6].long().sum())
            tile_pairs = int(res[10].numel())
    kernel = {k: round(1e3 * statistics.median(v[1:]), 2) for k, v in kernel_times.items() if len(v) > 1}
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    fwd_ms, bwd_ms = 1e3 * statistics.median(fwd), 1e3 * statistics.median(bwd)
    result = dict(
        backend=backend,
        primitive=primitive,
        surfels=n,
        width=width,
        height=height,
        forward_ms=round(fwd_ms, 2),
        backward_ms=round(bwd_ms, 2),
        total_ms=round(fwd_ms + bwd_ms, 2),
        **kernel,
        peak_memory_mib=round(peak, 1),
        threads=torch.get_num_threads(),
        repetitions=reps,
    )
    if pairs is not None:
        result.update(
            pixel_surfel_pairs=pairs,
            tile_surfel_pairs=tile_pairs,
            pairs_per_second_forward=round(pairs / (fwd_ms / 1e3)),
        )
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the JSON here")
    add_child_flag(ap)
    ap.add_argument("--quick", action="store_true", help="only the 20k/256 case")
    ap.add_argument(
        "--case", action="append", metavar="N,W,H", help="CPU case: N primitives at W x H, both primitives (repeatable)"
    )
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of a --case (median reported)")
    ap.add_argument("--roots", nargs="+", help="source trees whose kernels to time side by side (default: this one)")
    args = ap.parse_args()
    case = child_case(args)
    if case is not None:
        print_child_result(run_case(**case))
        return
    import torch

    from splat._backend import has_cuda_kernels

    cases = CASES[:2] if args.quick else CASES
    if args.case:
        cases = []
        for spec in args.case:
            n, w, h = (int(v) for v in spec.split(","))
            cases += [(n, w, h, ("cpu",), args.reps, p) for p in ("2dgs", "3dgs")]
    roots = args.roots or [None]
    results = []
    for n, w, h, backends, reps, primitive in cases:
        for backend in backends:
            if backend == "cuda" and not (torch.cuda.is_available() and has_cuda_kernels()):
                continue
            for root in roots:
                r = 1 if backend == "torch" else reps
                popen = {}
                if root is not None:
                    popen = dict(env={**os.environ, "PYTHONPATH": os.path.abspath(root)}, cwd=os.path.abspath(root))
                result, proc = run_child(
                    __file__, dict(n=n, width=w, height=h, backend=backend, reps=r, primitive=primitive), **popen
                )
                if result is None:
                    result = dict(
                        backend=backend, primitive=primitive, surfels=n, width=w, height=h, error=proc.stderr[-2000:]
                    )
                if root is not None:
                    result["root"] = root
                results.append(result)
                print(json.dumps(results[-1]), file=sys.stderr)
    if args.roots:
        ratios = {}
        for root in roots:
            mine = [r for r in results if r.get("root") == root and "error" not in r]
            keyed = {(r["primitive"], r["surfels"], r["width"]): r for r in mine}
            for (prim, n, w), r in keyed.items():
                other = keyed.get(("2dgs", n, w))
                if prim == "3dgs" and other:
                    ratio = round(r["total_ms"] / other["total_ms"], 2)
                    ratios[f"{root}: 3dgs_over_2dgs_time_{n // 1000}k_{w}"] = ratio
                    if "kernel_forward_ms" in r and "kernel_forward_ms" in other:
                        k3, k2 = (x["kernel_forward_ms"] + x["kernel_backward_ms"] for x in (r, other))
                        ratios[f"{root}: 3dgs_over_2dgs_kernel_time_{n // 1000}k_{w}"] = round(k3 / k2, 2)
        emit(dict(machine=machine(), command="python " + " ".join(sys.argv), results=results, ratios=ratios), args.out)
        return
    ratios = {}
    by_key = {
        (r["backend"], r.get("primitive", "2dgs"), r["surfels"], r["width"]): r for r in results if "error" not in r
    }
    if ("cpu", "2dgs", 20_000, 256) in by_key and ("torch", "2dgs", 20_000, 256) in by_key:
        ratios["cpu_over_reference_speedup_20k_256"] = round(
            by_key[("torch", "2dgs", 20_000, 256)]["total_ms"] / by_key[("cpu", "2dgs", 20_000, 256)]["total_ms"], 1
        )
    for backend, n, w in (("cpu", 20_000, 256), ("cpu", 100_000, 512), ("cuda", 1_000_000, 1920)):
        a, b = by_key.get((backend, "3dgs", n, w)), by_key.get((backend, "2dgs", n, w))
        if a and b:  # side by side in one run
            ratios[f"{backend}_3dgs_over_2dgs_time_{n // 1000}k_{w}"] = round(a["total_ms"] / b["total_ms"], 2)
    emit(dict(machine=machine(), results=results, ratios=ratios), args.out)


if __name__ == "__main__":
    main()
