"""splat against its peers, side by side in one process on the very same
inputs: gsplat's ``rasterization_2dgs`` (distortion on, packed and dense) and
diff-surfel-rasterization (the 2DGS paper's rasterizer, called through
gsplat's ``rasterization_2dgs_inria_wrapper``); and for 3D Gaussians,
``splat.rasterize_3dgs`` against gsplat's ``rasterization`` (its defaults,
packed).  Forward, backward, their sum and peak memory.  Prints JSON (and writes it with --out).  Not a test.

    python bench/rasterize_peers.py --out speed.json                # GPU: 0.5M / 1M / 3M surfels, 1080p
    python bench/rasterize_peers.py --device cpu --sizes 2000 --width 96 --height 64   # splat alone, CPU

The GPU campaign (scripts/gpu_campaign.sh, stage ``speed``) runs this with
the peers built on the device.  A peer that cannot be imported, or has no
GPU, is a row with ``skipped`` and the reason instead of numbers.

Scenes: splat.testing.surface_scene(N, width, height, float32, seed=0).
Every implementation is asked for everything it renders (colour, alpha,
depth, normal, distortion, and the median depth where it has one), and the
loss is the plain sum of those outputs.  gsplat also derives normals from
depth in its forward (render_mode RGB+ED), as does the diff-surfel wrapper;
splat has no such output.  The 3D Gaussians are the same surfels given a
third scale a tenth of the smaller one; both renderers are asked for
colour, expected depth (RGB+ED) and alpha, the outputs gsplat's
``rasterization`` has.  compat_gsplat is splat's drop-in for gsplat's
function (splat.compat.gsplat), called as gsplat_dense is: its cost over
splat, and its colour against the real gsplat's.  Times are CUDA-event medians over --reps
iterations after --warmup; memory is torch's peak allocation during one
forward + backward above what was allocated before it (inputs excluded).
On the CPU (the campaign's dry run) times are host clocks and memory the
process's peak resident size.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time

from report import emit, machine

# This checkout's splat, also where it is not pip-installed (the GPU machine gets a bare copy of the tree).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SIZES = (500_000, 1_000_000, 3_000_000)
# compat_gsplat: splat.compat.gsplat.rasterization_2dgs, the drop-in for gsplat's, called exactly as
# gsplat_dense is: its overhead over splat, and its colour against the real gsplat's (the shim's GPU parity).
IMPLS = ("splat", "gsplat_packed", "gsplat_dense", "diff_surfel", "compat_gsplat", "splat_3dgs", "gsplat_3dgs")
# Seen on an H200 (bench/results/gpu_h200_speed.json); gsplat's 2DGS trainer renders dense by default.
GSPLAT_PACKED_2DGS = (
    "gsplat 1.5.3's rasterization_2dgs cannot take colours in packed mode: it gathers neither "
    "[C, N, 3] colours nor SH coefficients by its [nnz] ids (a size mismatch in its torch.cat)"
)
NEAR, FAR = 0.2, 100.0  # splat.rasterize's defaults, passed to every peer


def one_line(error) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__


def peer_modules(device, unavailable=None):
    """{peer: module or the reason it is skipped (str)} for gsplat and
    diff_surfel; `unavailable` names peers not to import, with the reason."""
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        reason = "no CUDA device (the peers are CUDA-only)"
        return {"gsplat": reason, "diff_surfel": reason}
    unavailable = unavailable or {}
    if "gsplat" in unavailable:  # diff_surfel is called through gsplat's wrapper
        return {
            "gsplat": unavailable["gsplat"],
            "diff_surfel": unavailable.get(
                "diff_surfel", f"needs gsplat's rasterization_2dgs_inria_wrapper: {unavailable['gsplat']}"
            ),
        }
    found = {}
    try:
        import gsplat
        from gsplat.cuda._backend import _C

        # gsplat prints a warning and leaves _C None when it cannot build its kernels.
        found["gsplat"] = gsplat if _C is not None else "gsplat imported but its CUDA kernels did not build"
    except Exception as error:  # ImportError, or its JIT build failing
        found["gsplat"] = f"gsplat not importable: {one_line(error)}"
    if "diff_surfel" in unavailable:
        found["diff_surfel"] = unavailable["diff_surfel"]
        return found
    try:
        import diff_surfel_rasterization

        found["diff_surfel"] = diff_surfel_rasterization
        if isinstance(found["gsplat"], str):  # the wrapper that calls it is gsplat's
            found["diff_surfel"] = f"needs gsplat's rasterization_2dgs_inria_wrapper: {found['gsplat']}"
    except Exception as error:
        found["diff_surfel"] = f"diff_surfel_rasterization not importable: {one_line(error)}"
    return found


def renderer(impl, scene, device):
    """(leaf tensors, forward() -> outputs, loss(outputs) -> scalar, rgb(outputs) -> [H, W, 3])."""
    import torch

    n = scene["means"].shape[0]
    width, height = scene["width"], scene["height"]
    viewmat, K = scene["viewmat"].to(device), scene["K"].to(device)
    leaf = {
        k: scene[k].to(device).clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")
    }
    if impl.endswith("_3dgs"):  # the surfels with a third scale, a tenth of the smaller one
        s = scene["scales"]
        leaf["scales"] = torch.cat([s, 0.1 * s.amin(-1, keepdim=True)], 1).to(device).requires_grad_(True)
    if impl in ("splat", "splat_3dgs"):
        import splat

        rasterize = splat.rasterize_3dgs if impl == "splat_3dgs" else splat.rasterize

        def forward():
            return rasterize(
                leaf["means"],
                leaf["quats"],
                leaf["scales"],
                leaf["opacities"],
                leaf["colors"],
                viewmat,
                K,
                width,
                height,
                near=NEAR,
                far=FAR,
                backend="cuda" if device == "cuda" else "cpu",
            )

        def loss(o):
            if impl == "splat_3dgs":  # what gsplat's rasterization renders
                return o.rgb.sum() + o.depth.sum() + o.alpha.sum()
            return (
                o.rgb.sum() + o.alpha.sum() + o.depth.sum() + o.normal.sum() + o.distortion.sum() + o.median_depth.sum()
            )

        return leaf, forward, loss, lambda o: o.rgb
    if impl != "gsplat_3dgs":  # gsplat takes [N, 3] scales and ignores the third (the normal axis) for 2D Gaussians
        leaf["scales"] = torch.cat([scene["scales"], torch.zeros(n, 1)], 1).to(device).requires_grad_(True)
    if impl.startswith("gsplat") or impl == "compat_gsplat":
        if impl == "compat_gsplat":
            from splat.compat.gsplat import rasterization_2dgs as rasterize
        elif impl == "gsplat_3dgs":
            from gsplat.rendering import rasterization as rasterize  # its defaults (packed)
        else:
            from gsplat.rendering import rasterization_2dgs as rasterize
        surfels = {} if impl == "gsplat_3dgs" else dict(packed=impl == "gsplat_packed", distloss=True)

        # gsplat appends its depth channel to post-activation colours only
        # when they are per camera, [C, N, 3].
        def forward():
            return rasterize(
                leaf["means"],
                leaf["quats"],
                leaf["scales"],
                leaf["opacities"],
                leaf["colors"][None],
                viewmat[None],
                K[None],
                width,
                height,
                near_plane=NEAR,
                far_plane=FAR,
                render_mode="RGB+ED",
                **surfels,
            )

        def loss(o):
            if impl == "gsplat_3dgs":
                colors, alphas, _meta = o
                return colors.sum() + alphas.sum()
            colors, alphas, normals, _surf_normals, distort, median, _meta = o
            return colors.sum() + alphas.sum() + normals.sum() + distort.sum() + median.sum()

        return leaf, forward, loss, lambda o: o[0][0, ..., :3]
    from gsplat.rendering import rasterization_2dgs_inria_wrapper

    def forward():
        return rasterization_2dgs_inria_wrapper(
            leaf["means"],
            leaf["quats"],
            leaf["scales"],
            leaf["opacities"],
            leaf["colors"],
            viewmat[None],
            K[None],
            width,
            height,
            near_plane=NEAR,
            far_plane=FAR,
        )

    def loss(o):
        (colors, alphas), meta = o
        return colors.sum() + alphas.sum() + meta["normals_rend"].sum() + meta["render_distloss"].sum()

    return leaf, forward, loss, lambda o: o[0][0][0, ..., :3]


def measure(impl, scene, device, warmup, reps):
    """Median forward / backward milliseconds, peak memory and the rendered
    colour (for the agreement check) of one implementation."""
    return measure_renderer(renderer(impl, scene, device), device, warmup, reps)


def measure_renderer(rend, device, warmup, reps):
    """:func:`measure` for a (leaf, forward, loss, rgb) tuple as :func:`renderer`
    returns (the GPU campaign's fastmath stage times its own)."""
    import torch

    leaf, forward, loss_of, rgb_of = rend
    cuda = device == "cuda"

    def one():
        for t in leaf.values():
            t.grad = None
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.synchronize()
            wall = time.perf_counter()
            ev[0].record()
            out = forward()
            ev[1].record()
            loss = loss_of(out)
            ev[2].record()
            loss.backward()
            ev[3].record()
            torch.cuda.synchronize()
            wall = time.perf_counter() - wall
            return out, ev[0].elapsed_time(ev[1]), ev[2].elapsed_time(ev[3]), 1e3 * wall
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        loss = loss_of(out)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        return out, 1e3 * (t1 - t0), 1e3 * (t3 - t2), 1e3 * (t3 - t0)

    for _ in range(warmup):
        one()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    out = one()[0]
    if cuda:
        peak, kind = (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda_peak_allocated_above_inputs"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_process_peak_rss"
    rgb = rgb_of(out).detach().float().cpu()
    del out
    times = [one()[1:] for _ in range(reps)]
    fwd = statistics.median(t[0] for t in times)
    bwd = statistics.median(t[1] for t in times)
    return dict(
        forward_ms=round(fwd, 3),
        backward_ms=round(bwd, 3),
        total_ms=round(fwd + bwd, 3),
        wall_ms=round(statistics.median(t[2] for t in times), 3),
        backward_over_forward=round(bwd / fwd, 3),
        peak_memory_mib=round(peak, 1),
        memory_kind=kind,
        reps=reps,
    ), rgb


def agreement(a, b, name):
    """PSNR (None when identical: JSON has no infinity) and the largest difference of two colour images."""
    a, b = a.clamp(0, 1), b.clamp(0, 1)
    mse = float(((a - b) ** 2).mean())
    return {
        f"rgb_psnr_vs_{name}_db": round(10 * math.log10(1 / mse), 2) if mse > 0 else None,
        f"rgb_max_abs_diff_vs_{name}": round(float((a - b).abs().max()), 6),
    }


def targets(rows, size):
    """The issue's targets at `size` surfels, from the measured rows (None where a side is missing)."""
    at = {r["impl"]: r for r in rows if r["surfels"] == size and "total_ms" in r}
    s = at.get("splat")
    gs = [at[k] for k in ("gsplat_packed", "gsplat_dense") if k in at]
    ds = at.get("diff_surfel")
    t = {"surfels": size}
    if s:
        t["backward_over_forward"] = s["backward_over_forward"]
        t["backward_le_1_5x_forward"] = s["backward_over_forward"] <= 1.5
    if s and gs:
        best = min(gs, key=lambda r: r["total_ms"])
        t["speedup_vs_fastest_gsplat"] = round(best["total_ms"] / s["total_ms"], 3)
        t["fastest_gsplat"] = best["impl"]
        t["speedup_ge_2x_gsplat"] = t["speedup_vs_fastest_gsplat"] >= 2.0
        least = min(gs, key=lambda r: r["peak_memory_mib"])
        t["memory_over_leanest_gsplat"] = round(s["peak_memory_mib"] / max(least["peak_memory_mib"], 1e-9), 3)
        t["memory_le_gsplat"] = s["peak_memory_mib"] <= least["peak_memory_mib"]
    if s and ds:
        t["speedup_vs_diff_surfel"] = round(ds["total_ms"] / s["total_ms"], 3)
        t["speedup_ge_4x_diff_surfel"] = t["speedup_vs_diff_surfel"] >= 4.0
    s3, g3 = at.get("splat_3dgs"), at.get("gsplat_3dgs")
    if s3 and g3:  # no target in the issue: the figure beside the surfels'
        t["speedup_3dgs_vs_gsplat"] = round(g3["total_ms"] / s3["total_ms"], 3)
        t["memory_3dgs_over_gsplat"] = round(s3["peak_memory_mib"] / max(g3["peak_memory_mib"], 1e-9), 3)
    for name, measured in (("splat", s), ("gsplat", gs), ("diff_surfel", ds)):
        if not measured:  # say why a target could not be judged
            why = [
                r.get("skipped") or r.get("error") for r in rows if r["surfels"] == size and r["impl"].startswith(name)
            ]
            t[f"{name}_not_measured"] = next((w for w in why if w), "not run")
    return t


def run(
    sizes, width, height, device, warmup, reps, impls=IMPLS, log=print, time_left=lambda: math.inf, unavailable=None
):
    import torch

    from splat.testing import surface_scene

    peers = peer_modules(device, unavailable)
    rows = []
    for n in sizes:
        if time_left() < 30:  # the caller's time budget: the sizes left are rows that say so
            rows += [dict(impl=impl, surfels=n, width=width, height=height, skipped="out of time") for impl in impls]
            continue
        scene = surface_scene(n, width, height, dtype=torch.float32, seed=0)
        reference = gsplat_rgb = None
        for impl in impls:
            row = dict(impl=impl, surfels=n, width=width, height=height)
            peer = peers.get("gsplat" if impl.startswith("gsplat") else impl)  # None: splat's own
            if isinstance(peer, str):
                row["skipped"] = peer
            elif impl == "gsplat_packed":
                row["skipped"] = GSPLAT_PACKED_2DGS
            else:
                try:
                    result, rgb = measure(impl, scene, device, warmup, reps)
                    row.update(result)
                    if impl in ("splat", "splat_3dgs"):
                        reference = rgb  # each family's colour against splat's own
                    elif reference is not None:
                        row.update(agreement(rgb, reference, "splat"))
                    if impl == "gsplat_dense":
                        gsplat_rgb = rgb
                    elif impl == "compat_gsplat" and gsplat_rgb is not None:
                        row.update(agreement(rgb, gsplat_rgb, "gsplat_dense"))
                except Exception as error:  # OOM or a peer's failure: a row, not the end of the run
                    row["error"] = one_line(error)
                finally:
                    if device == "cuda":
                        torch.cuda.empty_cache()
            rows.append(row)
            log(" ".join(f"{k}={v}" for k, v in row.items() if k not in ("width", "height", "memory_kind")))
    size = 1_000_000 if 1_000_000 in sizes else sizes[len(sizes) // 2]
    return dict(
        rows=rows,
        targets=targets(rows, size),
        peers={k: (v if isinstance(v, str) else getattr(v, "__version__", "imported")) for k, v in peers.items()},
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (use --device cpu)")
    if min(args.sizes) < 1 or args.width < 1 or args.height < 1:
        ap.error("--sizes, --width and --height must be positive")
    result = run(
        args.sizes,
        args.width,
        args.height,
        args.device,
        args.warmup,
        args.reps,
        args.impls,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    emit(dict(command=" ".join(sys.argv), machine=machine(), **result), args.out)


if __name__ == "__main__":
    main()
