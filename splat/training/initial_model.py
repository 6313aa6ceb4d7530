"""The model a fresh run starts from, and this rank's part of it."""

from __future__ import annotations

import dataclasses
import sys
from typing import Dict, Optional

import torch

from ..distributed.group import Group, on_main
from ..distributed.sharded_model import shard_of
from ..keyed_random import INIT_SUBSAMPLE_STREAM, keyed_uniform
from ..model import GaussianModel, create_from_points


def within_budget(n: int, budget: int, seed: int) -> Optional[torch.Tensor]:  # [budget] int64, or None
    """The indices (increasing) of the ``budget`` points of ``n`` an initial
    model keeps under ``strategy.max_gaussians`` (None: all fit, or no
    budget): those with the smallest uniforms keyed by (``seed``, point
    index).  A uniform random subset keeps the start's density as the
    initialisation chose it (it already thins its filling sources to a
    coverage cell), costs O(n), and is the same on any number of processes;
    the kept surfels are sized from their own neighbours, so they still
    cover the points dropped around them."""
    if budget <= 0 or n <= budget:
        return None
    u = keyed_uniform(seed, INIT_SUBSAMPLE_STREAM, torch.arange(n, dtype=torch.int64)[:, None], 1)[:, 0]  # [n]
    order = torch.argsort(u, stable=True)
    return torch.sort(order[:budget]).values


def check_budget(budget: int, scene, verbose: bool = True) -> bool:
    """Whether ``strategy.max_gaussians`` fits the scene; if not (more
    primitives than the training views have pixels: more than one per pixel
    cannot all be seen), one warning line.  Not an error: the run still
    trains, and the default strategy simply never reaches it."""
    pixels = sum(int(f.width) * int(f.height) for f in scene.train)
    if budget > pixels:
        if verbose:
            print(
                f"warning: strategy.max_gaussians={budget:,} is more than the {pixels:,} pixels of the "
                f"{len(scene.train)} training views: the scene cannot use that many primitives",
                file=sys.stderr,
            )
        return False
    return True


def initial_model(cfg: Dict, scene, background: torch.Tensor, verbose: bool = True) -> GaussianModel:
    """Surfels on the start :func:`splat.data.initial_points.initial_points`
    picks for ``model.init`` (``auto``: the scene's or triangulated points,
    filled where they leave the views uncovered by stereo, then random
    points), sized by the 3DGS neighbour rule, bounded to
    ``model.init_max_scale_px`` pixels at the point's depth when that is
    not 0.  ``verbose``: print what it combined."""
    from ..data.initial_points import initial_points, pixel_footprint

    mcfg = cfg["model"]
    start = initial_points(
        scene,
        mcfg["init"],
        num_stereo=mcfg["init_num_stereo"],
        num_random=mcfg["init_num_random"],
        random_min_views=mcfg["init_random_min_views"],
        fill_spacing=mcfg["init_fill_spacing"],
        cache_dir=cfg["data"]["cache_dir"] or None,
        scene_name=cfg["data"]["path"],
        background=background,
    )
    if verbose:
        print(f"init: {start.description}", file=sys.stderr)
    budget = int(cfg["strategy"]["max_gaussians"])
    check_budget(budget, scene, verbose)
    keep = within_budget(start.points.shape[0], budget, cfg["seed"])
    if keep is not None:
        if verbose:
            print(
                f"init: {start.points.shape[0]:,} points over strategy.max_gaussians={budget:,}: "
                f"keeping a keyed random {budget:,}",
                file=sys.stderr,
            )
        start = dataclasses.replace(start, points=start.points[keep], colors=start.colors[keep])
    bound_px = float(mcfg["init_max_scale_px"])
    max_scales = bound_px * pixel_footprint(start.points, scene.train) if bound_px > 0 else None  # [M] world units
    return create_from_points(
        start.points,
        start.colors,
        mcfg["sh_degree"],
        mcfg["init_opacity"],
        mcfg["init_scale"],
        max_scales=max_scales,
        primitive=mcfg["primitive"],
    )


def initial_shard(cfg: Dict, scene, background: torch.Tensor, group: Group) -> GaussianModel:
    """This rank's balanced slice of :func:`initial_model` (built by rank 0
    and sent to all); with one process, the whole model."""
    if not group.distributed:
        return initial_model(cfg, scene, background, verbose=group.is_main)

    def build():
        model = initial_model(cfg, scene, background)
        return model.raw_state(), model.sh_degree

    params, sh_degree = on_main(group, build)
    return shard_of(params, sh_degree, group)
