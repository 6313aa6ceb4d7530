"""One training step through the C-ABI kernels (ctypes, splat/_native.py)
against the same kernels in a torch extension (splat._C built from this
tree's kernels/bindings.cpp), alternating step by step in ONE process on one
model, so both see the same load and the same surfels.  Prints JSON (and
writes it with --out).  Not a test: numbers depend on the machine.

    python bench/wheel_overhead_step.py --old-extension EXT/_C.so --out bench/results/wheel_overhead_step.json

The extension: ``torch.utils.cpp_extension.load("_C", [kernels/bindings.cpp,
kernels/cpu/*.cpp], extra_cflags=_compile_flags.CXX_FLAGS, ...)``, the
torch-extension build that source installs on a CUDA torch keep (setup.py),
here without CUDA.

The trainer first trains ``--warmup`` steps (C ABI) so that the model has a
trained size; then each pair runs the same step number once per build, the
order swapped every pair.  Steps are taken after the config's refine_stop, so
no densification changes the model between the two halves of a pair.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
import wheel_bitwise as w  # noqa: E402
from report import commit, emit, machine  # noqa: E402

from splat.config import load_config  # noqa: E402
from splat.trainer import Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-extension", required=True, help="a splat._C torch extension of this tree's kernels")
    ap.add_argument("--data", default=str(ROOT / "data" / "sample_scene"))
    ap.add_argument("--config", default="fast")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    old, new = w.load_old(args.old_extension), w.kernels()
    cfg = load_config(args.config, [f"data.path={args.data}", "log.progress=false"])
    after = int(cfg["strategy"]["refine_stop"]) + 1
    times = {"torch_extension": [], "c_abi": []}
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out)
        w.use(new)
        for step in range(1, args.warmup + 1):
            trainer.train_step(step)
        for pair in range(args.pairs + 2):
            builds = (("torch_extension", old), ("c_abi", new))
            for name, ext in builds if pair % 2 else builds[::-1]:
                w.use(ext)
                t0 = time.perf_counter()
                trainer.train_step(after + pair)
                if pair >= 2:  # the first two pairs warm both paths up
                    times[name].append(1e3 * (time.perf_counter() - t0))
        surfels = int(trainer.model.num_gaussians)
        trainer.close()
    summary = {k: {"median_ms": round(statistics.median(v), 3), "min_ms": round(min(v), 3)} for k, v in times.items()}
    ratios = [n / o for n, o in zip(times["c_abi"], times["torch_extension"])]
    emit(
        {
            "benchmark": "wheel_overhead_step",
            "commit": commit(str(ROOT)),
            "machine": machine(),
            "command": "python bench/wheel_overhead_step.py " + " ".join(sys.argv[1:]),
            "config": args.config,
            "surfels": surfels,
            "threads": args.threads,
            "pairs": args.pairs,
            "ms_per_step": summary,
            "c_abi_over_extension": {
                "median_of_pair_ratios": round(statistics.median(ratios), 4),
                "ratio_of_medians": round(summary["c_abi"]["median_ms"] / summary["torch_extension"]["median_ms"], 4),
                "ratio_of_minima": round(summary["c_abi"]["min_ms"] / summary["torch_extension"]["min_ms"], 4),
            },
        },
        args.out,
    )


if __name__ == "__main__":
    main()
