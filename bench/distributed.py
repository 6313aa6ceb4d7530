"""Sharded rendering across processes (issue 23): bytes exchanged per step,
the fraction of surfels each camera sees, and step time, for 1, 2 and 3
processes on one machine.  Prints JSON (and writes it with --out).

    python bench/distributed.py --ply OUT/point_cloud.ply --data ../shared/scenes/still_life \\
        --out bench/results/distributed_still_life.json

One step = ``--batch`` training cameras rendered with
:func:`splat.distributed.render_sharded` from the model's surfels, dealt to
the ranks by id (surfel i on rank i mod N), a loss on every output, and the
backward through the exchange.  What is measured per step (medians over
``--steps`` steps after one warm-up):

* ``bytes_forward``: kernel records (19 floats + 5 int64 per visible surfel)
  that leave their rank; ``bytes_backward``: their gradients coming back
  (19 floats each); summed over the ranks;
* ``seconds``: the slowest rank's step time, and the compute-only time of
  the one-process run for the scaling model;
* ``visible_fraction``: visible surfels per camera / all surfels (the
  exchange volume's driver).

``predicted_bytes`` checks the model bytes(N) = B v n (N - 1) / N
(19 * 4 * 2 + 5 * 8), with v the measured visible fraction: with surfels
dealt at random, a camera's visible surfels are on the other ranks with
probability (N - 1) / N.  Not a test: times depend on the machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from report import emit, machine

FLOAT_BYTES = 4
RECORD_FLOATS, RECORD_INTS = 19, 5


def step_runs(group, ply, data, downscale, batch, steps):
    """One rank's part: ``steps`` sharded training steps; returns per-step
    bytes, times and visibility."""
    import resource

    import torch

    from splat.data import load_scene
    from splat.distributed import Camera, render_sharded
    from splat.model import load_ply

    model = load_ply(ply)
    scene = load_scene(data, downscale=downscale)
    n = model.num_gaussians
    ids = torch.arange(n)
    mine = ids[ids % group.world_size == group.rank]
    p = {"means": model.means.detach()[mine], "quats": model.quats.detach()[mine],
         "scales": model.scales.detach()[mine], "opacities": model.opacities.detach()[mine],
         "colors": model.colors(model.sh_degree).detach()[mine]}
    p = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    frames = scene.train
    rows = []
    for s in range(steps + 1):
        cams = [Camera(f.viewmat, f.K, int(f.width), int(f.height), torch.ones(3))
                for f in (frames[(s * batch + b) % len(frames)] for b in range(batch))]
        t0 = time.perf_counter()
        r = render_sharded(**p, ids=mine, cameras=cams, group=group, sh_degree=model.sh_degree)
        loss = r.anchor
        for out in r.outputs.values():
            loss = loss + out.rgb.mean() + out.depth.mean() + out.normal.mean() + out.distortion.mean()
        loss.backward()
        seconds = time.perf_counter() - t0
        for v in p.values():
            v.grad = None
        visible = [int((rad > 0).sum()) for rad in r.radii]  # this rank's surfels drawn, per camera
        sent_rows = sum(visible[i] for i in range(batch) if i % group.world_size != group.rank)
        if s:  # the first step warms up
            rows.append({"seconds": seconds, "bytes_forward": r.bytes_sent,
                         "bytes_backward": sent_rows * RECORD_FLOATS * FLOAT_BYTES, "visible": visible})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rows": rows, "n": n, "local": len(mine), "peak_rss_mib": peak}


def summarise(results, world, batch, threads):
    steps = len(results[0]["rows"])
    n = results[0]["n"]
    per_step = []
    for s in range(steps):
        rows = [r["rows"][s] for r in results]
        visible = [sum(r["visible"][c] for r in rows) for c in range(batch)]  # all ranks' surfels, per camera
        per_step.append({"seconds": max(r["seconds"] for r in rows),
                         "bytes_forward": sum(r["bytes_forward"] for r in rows),
                         "bytes_backward": sum(r["bytes_backward"] for r in rows),
                         "visible_fraction": statistics.mean(v / n for v in visible)})
    med = {k: statistics.median(p[k] for p in per_step) for k in per_step[0]}
    v = med["visible_fraction"]
    predicted = batch * v * n * (world - 1) / world * (RECORD_FLOATS * FLOAT_BYTES * 2 + RECORD_INTS * 8)
    return {"processes": world, "threads_per_process": threads, "surfels": n, "batch": batch, "steps": steps,
            "seconds_per_step": round(med["seconds"], 4), "steps_per_second": round(1.0 / med["seconds"], 3),
            "bytes_forward_per_step": int(med["bytes_forward"]), "bytes_backward_per_step": int(med["bytes_backward"]),
            "bytes_per_step": int(med["bytes_forward"] + med["bytes_backward"]),
            "predicted_bytes_per_step": int(predicted), "visible_fraction": round(v, 4),
            "peak_rss_mib_per_process": [round(r["peak_rss_mib"], 1) for r in results],
            "surfels_per_process": [r["local"] for r in results]}


def scaling_model(one, by_world, batch):
    """Where communication overtakes compute, on paper, from the measured
    one-process step time t1 and bytes per step: N processes compute
    t1 / N (ideal split) and move bytes(N) = b1 (N - 1) / N ... per step,
    where b1 is the volume at N -> infinity per camera batch.  Crossover:
    t1 / N = bytes(N) / bandwidth."""
    t1 = one["seconds_per_step"]
    # bytes(N) = c (N - 1) / N with c the measured volume scale (from the largest N measured).
    largest = by_world[max(by_world)]
    nmax = largest["processes"]
    c = largest["bytes_per_step"] * nmax / max(nmax - 1, 1)
    out = {"t1_seconds_per_step": t1, "bytes_scale_c": int(c),
           "formula": "compute(N) = t1 / N; exchange(N) = c (N - 1) / N / bandwidth; "
                      "communication overtakes compute where t1 / N = c (N - 1) / (N bandwidth), i.e. "
                      "N* = 1 + t1 bandwidth / c"}
    for name, bandwidth in (("4_cpu_nodes_10GbE", 10e9 / 8),):
        out[name] = {"bandwidth_bytes_per_s": bandwidth,
                     "crossover_processes": round(1 + t1 * bandwidth / c, 1),
                     "note": "t1 measured on this machine's CPU; a CPU node of the cluster is assumed as fast"}
    out["8_gpus_nvlink"] = {"crossover_processes": None,
                            "note": "needs the one-GPU step time t1, not measured (no GPU was lent): "
                                    "N* = 1 + t1 * bandwidth / c with NVLink's bandwidth"}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ply", required=True, help="a trained model (point_cloud.ply)")
    ap.add_argument("--data", required=True, help="its scene folder (for the training cameras)")
    ap.add_argument("--downscale", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4, help="cameras per step")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out")
    args = ap.parse_args()
    for path, what in ((args.ply, "--ply"), (args.data, "--data")):
        if not Path(path).exists():
            raise SystemExit(f"error: {what} {path} does not exist")
    import os
    import tempfile

    from splat.distributed.local import run_ranks

    cores = os.cpu_count() or 1
    runs = []
    for world in args.worlds:
        threads = max(cores // world, 1)
        with tempfile.TemporaryDirectory() as tmp:
            results = run_ranks(step_runs, world, tmp, args.ply, args.data, args.downscale, args.batch, args.steps,
                                timeout_s=1800, threads=threads)
        runs.append(summarise(results, world, args.batch, threads))
        print(runs[-1], file=sys.stderr)
    by_world = {r["processes"]: r for r in runs}
    result = {"machine": machine(), "ply": str(args.ply), "data": str(args.data), "downscale": args.downscale,
              "runs": runs}
    if 1 in by_world and len(by_world) > 1:
        result["scaling_model"] = scaling_model(by_world[1], by_world, args.batch)
    emit(result, args.out)


if __name__ == "__main__":
    main()
