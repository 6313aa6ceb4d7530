"""The optimisers of a run: one Adam per parameter (so densification can
edit one parameter's moments at a time) and the means' learning-rate decay."""

from __future__ import annotations

import math
from typing import Dict

import torch

from .model import GaussianModel


def means_lr(step: int, iterations: int, lr_init: float, lr_final: float) -> float:
    """Exponential decay from lr_init (step 0) to lr_final (last step)."""
    t = min(max(step / max(iterations, 1), 0.0), 1.0)
    return math.exp((1 - t) * math.log(lr_init) + t * math.log(lr_final))


def make_optimizers(model: GaussianModel, lr: Dict, scene_radius: float) -> Dict[str, torch.optim.Adam]:
    """One Adam per parameter (lets the strategy edit rows of one parameter's moments)."""
    rates = {
        "means": lr["means"] * scene_radius,
        "quats": lr["quats"],
        "scales": lr["scales"],
        "opacities": lr["opacities"],
        "sh0": lr["sh0"],
        "shN": lr["shN"],
    }
    # eps=1e-15 as in 3DGS: parameters with tiny gradients (SH rest) still move.
    # On the CPU, foreach Adam rather than fused: the fused kernel rounds the
    # last few elements of a tensor (its vector loop's scalar tail)
    # differently from the rest, so a surfel's update would depend on where
    # its row falls in its process's shard, and N processes would drift from
    # one.  foreach is position-independent (tests/test_distributed_train.py)
    # and slower than fused (docs/results.md), a price paid for that
    # invariance.  CUDA keeps fused: its
    # rasterizer sums gradients with atomics, so no order is bitwise there.
    fused = model.means.is_cuda
    return {
        name: torch.optim.Adam([model.params[name]], lr=rates[name], eps=1e-15, fused=fused, foreach=not fused)
        for name in model.params.keys()
    }
