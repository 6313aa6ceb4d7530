"""Training on several processes (issue 23): speed, memory per process,
bytes exchanged, and a scaling model on paper.  Prints JSON (and writes it
with --out).  Every run is on this machine's CPUs, with gloo.

    python bench/distributed.py --data ../shared/scenes/dtu_scan24 \\
        --out bench/results/distributed_dtu_scan24.json

Parts (all in one run, so ratios are side by side):

1. ``training``: ``train.py``'s trainer on ``--data`` for ``--steps`` steps
   (``configs/fast.yaml``, the scene's points, ``--downscale``, batch
   ``--batch``): one process with all the cores' threads against as many
   processes of one thread each; steps/s from the trainer's own clock
   (initialisation excluded), peak RSS per process, and the exchange it
   measured (``exchange_mb_per_step``).
2. ``model_memory``: the training state of a ``--surfels`` model (SH degree
   3: raw parameters, their gradients and Adam moments, densification
   statistics, ids) held by each rank for N = 1, 2, 3, counted tensor by
   tensor (exact bytes, not RSS): target at most 1/N + 15 % of N = 1.
3. ``exchange``: the trained model of part 1 rendered in batches of
   ``--batch`` training cameras with surfels dealt by id over N = 1, 2, 3
   processes: bytes each step moves, against the model
   ``bytes(N) = B v n (N - 1) / N * (19 * 4 * 2 + 5 * 8)`` with v the
   measured fraction of surfels a camera sees, and the same with surfels
   dealt by space (sorted along the scene's longest axis, contiguous
   blocks), to see whether locality cuts the exchange.
4. ``scaling_model``: from the measured compute per step and bytes per
   step, the N at which the exchange overtakes the compute, on paper.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from report import commit, emit, machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD_FLOATS, RECORD_INTS, FLOAT_BYTES = 19, 5, 4
RECORD_BYTES = RECORD_FLOATS * FLOAT_BYTES * 2 + RECORD_INTS * 8  # forward records + backward gradients


# ------------------------------------------------------------- 1. training
def train_rank(group, data, downscale, steps, batch, out):
    import resource

    from splat.config import load_config
    from splat.trainer import Trainer

    cfg = load_config(
        str(ROOT / "configs" / "fast.yaml"),
        [
            f"data.path={data}",
            f"data.downscale={downscale}",
            f"train.iterations={steps}",
            f"train.batch_size={batch}",
            "model.init=points",
            "log.progress=false",
            "checkpoint.every=0",
        ],
    )
    metrics = Trainer(cfg, out, group=group).train()
    return {"metrics": metrics, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def training(args, tmp):
    from splat.distributed.local import run_ranks

    cores = os.cpu_count() or 1
    runs = []
    for world, threads in ((1, cores), (cores, 1)):
        out = Path(tmp) / f"train_{world}"
        res = run_ranks(
            train_rank,
            world,
            Path(tmp) / f"ranks_{world}",
            args.data,
            args.downscale,
            args.steps,
            args.batch,
            str(out),
            timeout_s=7200,
            threads=threads,
        )
        m = res[0]["metrics"]
        runs.append(
            {
                "processes": world,
                "threads_per_process": threads,
                "steps": m["iterations"],
                "train_seconds": m["train_seconds"],
                "steps_per_second": round(m["iterations"] / m["train_seconds"], 3),
                "peak_rss_mib_per_process": [round(r["peak_rss_mib"], 1) for r in res],
                "exchange_mb_per_step": m.get("exchange_mb_per_step", 0.0),
                "surfels": m["n_gaussians"],
                "test_psnr": round(m["test.psnr"], 3),
            }
        )
        print(runs[-1], file=sys.stderr)
    ply = Path(tmp) / "train_1" / "point_cloud.ply"
    return {
        "runs": runs,
        "speedup_processes_over_threads": round(runs[1]["steps_per_second"] / runs[0]["steps_per_second"], 3),
    }, ply


# --------------------------------------------------------- 2. model memory
def memory_rank(group, surfels):
    import torch

    from splat.config import DEFAULT_CONFIG
    from splat.distributed.sharded_model import shard_of
    from splat.sh import num_sh_bases
    from splat.state import PrimitiveState
    from splat.strategy import make_strategy
    from splat.trainer import make_optimizers

    g = torch.Generator().manual_seed(0)
    params = {
        "means": torch.randn(surfels, 3, generator=g),
        "quats": torch.randn(surfels, 4, generator=g),
        "scales": torch.randn(surfels, 2, generator=g),
        "opacities": torch.randn(surfels, generator=g),
        "sh0": torch.randn(surfels, 1, 3, generator=g),
        "shN": torch.randn(surfels, num_sh_bases(3) - 1, 3, generator=g),
    }
    model = shard_of(params, 3, group)
    del params
    optimizers = make_optimizers(model, DEFAULT_CONFIG["train"]["lr"], 1.0)
    for p in model.params.values():
        p.grad = torch.zeros_like(p)
    for opt in optimizers.values():
        opt.step()  # allocates the moments
    strategy = make_strategy(DEFAULT_CONFIG["strategy"], 1.0, group=group)
    state = PrimitiveState(model, optimizers)
    strategy.bind(state)
    strategy._reset_stats(model.num_gaussians)
    tensors = list(model.params.values()) + [p.grad for p in model.params.values()] + [model.ids]
    tensors += [
        v
        for opt in optimizers.values()
        for st in opt.state.values()
        for v in st.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]
    tensors += [v for k in state.stat_names() if (v := state.stat(k)) is not None]
    return {"surfels": model.num_gaussians, "bytes": sum(t.numel() * t.element_size() for t in tensors)}


def model_memory(args, tmp):
    from splat.distributed.local import run_ranks

    rows = []
    for world in (1, 2, 3):
        res = run_ranks(memory_rank, world, Path(tmp) / f"mem_{world}", args.surfels, timeout_s=1800)
        rows.append(
            {
                "processes": world,
                "surfels_per_rank": [r["surfels"] for r in res],
                "mb_per_rank": [round(r["bytes"] / 2**20, 2) for r in res],
            }
        )
    one = rows[0]["mb_per_rank"][0]
    for r in rows:
        r["largest_over_one_process"] = round(max(r["mb_per_rank"]) / one, 4)
        r["target_at_most"] = round(1 / r["processes"] + 0.15, 4)
        r["meets_target"] = r["largest_over_one_process"] <= r["target_at_most"]
    return {"surfels": args.surfels, "sh_degree": 3, "runs": rows}


# ------------------------------------------------------------- 3. exchange
def exchange_rank(group, ply, data, downscale, batch, steps, deal):
    import time

    import torch

    from splat.data import load_scene
    from splat.distributed import Camera, render_sharded
    from splat.ply import load_ply

    model = load_ply(ply)
    scene = load_scene(data, downscale=downscale)
    n = model.num_gaussians
    if deal == "id":
        owner = torch.arange(n) % group.world_size
    else:  # by space: contiguous blocks along the longest axis of the surfels' extent
        means = model.means.detach()
        axis = int((means.max(0).values - means.min(0).values).argmax())
        owner = torch.empty(n, dtype=torch.int64)
        owner[torch.argsort(means[:, axis])] = torch.arange(n) * group.world_size // n
    mine = torch.arange(n)[owner == group.rank]
    p = {
        "means": model.means.detach()[mine],
        "quats": model.quats.detach()[mine],
        "scales": model.scales.detach()[mine],
        "opacities": model.opacities.detach()[mine],
        "colors": model.colors(model.sh_degree).detach()[mine],
    }
    p = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    frames = scene.train
    rows = []
    for s in range(steps + 1):
        cams = [
            Camera(f.viewmat, f.K, int(f.width), int(f.height), torch.ones(3))
            for f in (frames[(s * batch + b) % len(frames)] for b in range(batch))
        ]
        t0 = time.perf_counter()
        r = render_sharded(**p, ids=mine, cameras=cams, group=group, sh_degree=model.sh_degree)
        loss = r.anchor
        for out in r.outputs.values():
            loss = loss + out.rgb.mean() + out.depth.mean() + out.normal.mean() + out.distortion.mean()
        loss.backward()
        seconds = time.perf_counter() - t0
        for v in p.values():
            v.grad = None
        if s:  # the first step warms up
            rows.append(
                {
                    "seconds": seconds,
                    "bytes": r.bytes_sent + r.bytes_backward,
                    "visible": [int((rad > 0).sum()) for rad in r.radii],
                }
            )
    return {"rows": rows, "n": n}


def exchange(args, ply, tmp):
    from splat.distributed.local import run_ranks

    runs = []
    for deal in ("id", "space"):
        for world in (1, 2, 3):
            if deal == "space" and world == 1:
                continue
            res = run_ranks(
                exchange_rank,
                world,
                Path(tmp) / f"ex_{deal}_{world}",
                str(ply),
                args.data,
                args.downscale,
                args.batch,
                args.exchange_steps,
                deal,
                timeout_s=3600,
                threads=1,
            )
            n = res[0]["n"]
            per_step = []
            for s in range(len(res[0]["rows"])):
                rows = [r["rows"][s] for r in res]
                visible = [sum(r["visible"][c] for r in rows) for c in range(args.batch)]
                per_step.append(
                    {
                        "seconds": max(r["seconds"] for r in rows),
                        "bytes": sum(r["bytes"] for r in rows),
                        "visible_fraction": statistics.mean(v / n for v in visible),
                    }
                )
            med = {k: statistics.median(p[k] for p in per_step) for k in per_step[0]}
            v = med["visible_fraction"]
            predicted = args.batch * v * n * (world - 1) / world * RECORD_BYTES
            runs.append(
                {
                    "deal": deal,
                    "processes": world,
                    "surfels": n,
                    "batch": args.batch,
                    "seconds_per_step_slowest_rank": round(med["seconds"], 4),
                    "bytes_per_step": int(med["bytes"]),
                    "predicted_bytes_per_step": int(predicted),
                    "visible_fraction": round(v, 4),
                }
            )
            print(runs[-1], file=sys.stderr)
    return {"runs": runs}


# ------------------------------------------------------- 4. scaling model
def scaling_model(train, ex):
    """N* where compute t1 / N meets exchange bytes(N) / bandwidth, with
    bytes(N) = c (N - 1) / N: N* = 1 + t1 bandwidth / c."""
    one = next(r for r in train["runs"] if r["processes"] == 1)
    t1 = 1.0 / one["steps_per_second"]
    by_id = [r for r in ex["runs"] if r["deal"] == "id" and r["processes"] > 1]
    largest = max(by_id, key=lambda r: r["processes"])
    c = largest["bytes_per_step"] * largest["processes"] / (largest["processes"] - 1)
    model = {
        "t1_seconds_per_step_one_process": round(t1, 4),
        "c_bytes_per_step": int(c),
        "formula": "compute(N) = t1 / N, exchange(N) = c (N - 1) / N / bandwidth; they meet at "
        "N* = 1 + t1 * bandwidth / c (beyond it a step is bound by the exchange)",
        "caveats": "c scales with the surfels a camera sees (v n) and the batch; t1 with image size and "
        "surfels; no overlap of exchange and compute is assumed; latency ignored",
    }
    tenGbE = 10e9 / 8 * 0.9  # 10 GbE at 90 % of line rate
    model["4_cpu_nodes_10GbE"] = {
        "bandwidth_bytes_per_s": tenGbE,
        "n_star": round(1 + t1 * tenGbE / c, 1),
        "assumes": "a cluster node computes a step as fast as this machine's one process (t1 measured here)",
    }
    nvlink = 300e9  # bytes/s per GPU, NVLink 3 (A100) one direction; H100 NVLink 4: 450e9
    model["8_gpus_nvlink"] = {
        "bandwidth_bytes_per_s": nvlink,
        "n_star_if_gpu_step_is": {f"{ms} ms": round(1 + ms / 1000 * nvlink / c, 1) for ms in (1, 5, 20)},
        "assumes": "no GPU was lent, so the one-GPU step time is not measured: N* is given for 1, 5 and 20 ms "
        "per step, with this scene's exchange volume c",
    }
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a scene folder (dtu_scan24)")
    ap.add_argument("--downscale", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="training steps of part 1")
    ap.add_argument("--batch", type=int, default=2, help="cameras per step")
    ap.add_argument("--surfels", type=int, default=1_000_000, help="model size of part 2")
    ap.add_argument("--exchange-steps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not Path(args.data).exists():
        raise SystemExit(f"error: --data {args.data} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        train, ply = training(args, tmp)
        memory = model_memory(args, tmp)
        ex = exchange(args, ply, tmp)
    emit(
        {
            "machine": machine(),
            "commit": commit(str(ROOT)),
            "data": str(args.data),
            "downscale": args.downscale,
            "training": train,
            "model_memory": memory,
            "exchange": ex,
            "scaling_model": scaling_model(train, ex),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
