"""The model a fresh run starts from, and this rank's part of it."""

from __future__ import annotations

import sys
from typing import Dict

import torch

from ..distributed.group import Group, on_main
from ..distributed.sharded_model import shard_of
from ..model import GaussianModel, create_from_points


def initial_model(cfg: Dict, scene, background: torch.Tensor, verbose: bool = True) -> GaussianModel:
    """Surfels on the start :func:`splat.data.initial_points.initial_points`
    picks for ``model.init`` (``auto``: the scene's or triangulated points,
    filled where they leave the views uncovered by stereo, then random
    points), sized by the 3DGS neighbour rule bounded by a few pixels at the
    point's depth.  ``verbose``: print what it combined."""
    from ..data.initial_points import initial_points

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
    return create_from_points(
        start.points,
        start.colors,
        mcfg["sh_degree"],
        mcfg["init_opacity"],
        mcfg["init_scale"],
        max_scales=start.max_scales,
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
