"""Rasterizer forward + backward, old code against new, side by side in one
run: milliseconds, peak resident memory and the speed-up.  Prints JSON (and
writes it with --out).  Not a test: timings depend on the machine and its load.

    git worktree add /tmp/old <commit> && (cd /tmp/old && python setup.py build_ext --inplace)
    python bench/rasterize_compare.py --roots /tmp/old . --out bench/results/rasterize_compare_cpu.json

Each (case, root, repetition) runs in its own subprocess with that root first
on PYTHONPATH, so peak memory (ru_maxrss) belongs to that run alone, and the
roots alternate repetition by repetition so that both see the same machine
load.  The reported time is the median over repetitions of each run's best
of --inner iterations (after one warm-up iteration); memory is the largest
peak seen.  Each subprocess is capped at --mem-limit-gib of address space,
so a run that would exhaust the machine fails cleanly instead.

Cases (float32, CPU backend):
    surfaces_100k_512       splat.testing.surface_scene: 100k surfels on a
                            plane and spheres, trained-model-like sizes, 512 x 512
    surfaces_1m_1080p       the same at 1M surfels, 1920 x 1080
    fullscreen_20k_1080p    20k faint surfels facing the camera, each larger
                            than the screen (every tile lists every surfel):
                            the worst case for per-(tile, surfel) memory
Every root renders the very same inputs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

from report import add_child_flag, child_case, commit, emit, machine, print_child_result, run_child

CASES = {
    "surfaces_100k_512": (100_000, 512, 512),
    "surfaces_1m_1080p": (1_000_000, 1920, 1080),
    "fullscreen_20k_1080p": (20_000, 1920, 1080),
}


def make_scene(case):
    """The case's inputs; identical in every root (splat.testing.surface_scene
    is unchanged since the baseline commit; the full-screen scene is built here)."""
    import torch

    n, width, height = CASES[case]
    if not case.startswith("fullscreen"):
        from splat.testing import surface_scene

        return surface_scene(n, width, height, dtype=torch.float32, seed=0)
    # Facing the camera (identity pose) at depths 2..6, each ~3 sigma wider than the view.
    g = torch.Generator().manual_seed(0)
    depth = 2.0 + 4.0 * torch.rand(n, generator=g)
    means = torch.stack([0.1 * torch.randn(n, generator=g), 0.1 * torch.randn(n, generator=g), depth], -1)
    f = 0.9 * width
    K = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]])
    return dict(
        means=means,
        quats=torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1),
        scales=(depth[:, None] * width / f) * torch.ones(n, 2),
        opacities=0.01 + 0.02 * torch.rand(n, generator=g),
        colors=torch.rand(n, 3, generator=g),
        viewmat=torch.eye(4),
        K=K,
        width=width,
        height=height,
    )


def run_one(case, inner):
    """One measurement in this process: best forward and backward of `inner`
    iterations after a warm-up."""
    import torch

    import splat

    scene = make_scene(case)
    params = {k: scene[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
    fwd, bwd = [], []
    for it in range(inner + 1):
        t0 = time.perf_counter()
        out = splat.rasterize(**{**scene, **params}, backend="cpu")
        t1 = time.perf_counter()
        loss = out.rgb.sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum() + out.median_depth.sum()
        loss.backward()
        t2 = time.perf_counter()
        if it:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        for p in params.values():
            p.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return dict(
        forward_ms=1e3 * min(fwd),
        backward_ms=1e3 * min(bwd),
        peak_rss_mib=peak,
        threads=torch.get_num_threads(),
        alpha_mean=float(out.alpha.detach().mean()),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roots", nargs="+", default=["."], help="code trees to compare (first = baseline)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--reps", type=int, default=3, help="subprocess runs per (case, root)")
    ap.add_argument("--inner", type=int, default=2, help="timed iterations per run, after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mem-limit-gib", type=float, default=14.0)
    ap.add_argument("--out", help="also write the JSON here")
    add_child_flag(ap)
    args = ap.parse_args()
    case = child_case(args)
    if case is not None:
        print_child_result(run_one(**case))
        return

    limit = int(args.mem_limit_gib * 2**30)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    roots = [os.path.abspath(r) for r in args.roots]
    runs = {(c, r): [] for c in args.cases for r in roots}
    errors = {}
    for case in args.cases:
        for rep in range(args.reps):
            for root in roots if rep % 2 == 0 else roots[::-1]:
                if (case, root) in errors:
                    continue
                env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS=str(args.threads))
                r, proc = run_child(__file__, dict(case=case, inner=args.inner), env=env, preexec_fn=cap, cwd=root)
                if r is None:
                    last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                    errors[(case, root)] = f"exit {proc.returncode}: {last[-300:]}"
                    print(f"{case} {root}: {errors[(case, root)]}", file=sys.stderr)
                    continue
                runs[(case, root)].append(r)
                print(f"{case} {root}: {r}", file=sys.stderr, flush=True)

    table = []
    for case in args.cases:
        for root in roots:
            rs = runs[(case, root)]
            row = dict(case=case, surfels=CASES[case][0], width=CASES[case][1], height=CASES[case][2], root=root)
            if (case, root) in errors:
                row["error"] = errors[(case, root)]
            if rs:
                f = statistics.median(r["forward_ms"] for r in rs)
                b = statistics.median(r["backward_ms"] for r in rs)
                row.update(
                    forward_ms=round(f, 1),
                    backward_ms=round(b, 1),
                    total_ms=round(f + b, 1),
                    peak_rss_mib=round(max(r["peak_rss_mib"] for r in rs), 1),
                    runs=len(rs),
                    alpha_mean=rs[0]["alpha_mean"],
                )
            table.append(row)
    ratios = {}
    if len(roots) > 1:
        for case in args.cases:
            old = next(t for t in table if t["case"] == case and t["root"] == roots[0])
            new = next(t for t in table if t["case"] == case and t["root"] == roots[-1])
            if "total_ms" in old and "total_ms" in new:
                ratios[case] = dict(
                    speedup_total=round(old["total_ms"] / new["total_ms"], 2),
                    speedup_forward=round(old["forward_ms"] / new["forward_ms"], 2),
                    speedup_backward=round(old["backward_ms"] / new["backward_ms"], 2),
                    memory_ratio=round(new["peak_rss_mib"] / old["peak_rss_mib"], 3),
                )
    emit(
        dict(
            command=" ".join([os.path.basename(sys.executable)] + sys.argv),
            machine=machine(threads=args.threads),
            commits={root: commit(root) for root in roots},
            mem_limit_gib=args.mem_limit_gib,
            results=table,
            ratios=ratios,
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
