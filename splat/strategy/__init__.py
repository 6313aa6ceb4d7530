"""Densification strategies: when and how primitives are added and removed.

A strategy sees the model, its optimisers and each step's rasterizer output,
and edits the primitives (clone / split / prune / reset) through the run's
table of per-primitive state, :class:`splat.state.PrimitiveState`, which
keeps parameters, Adam moments, ids and the strategy's registered per-row
statistics aligned (and moves them between processes and into
checkpoints).  Other state goes through ``state_dict`` / ``load_state_dict``.

The trainer calls :meth:`Strategy.bind` with the table once, then, every step
(:class:`splat.training.step.BatchStep`), with one :class:`Visibility` per camera
of the step's B cameras (``train.batch_size``), whether they render one by one or
together::

    render the B cameras, their losses
    strategy.step_pre_backward(model, optimizers, seen, step)    # per camera
    backward of the mean loss (camera by camera: each before the next renders)
    strategy.loss(model)                                          # an extra loss term, or None
    optimizer steps
    strategy.step_post_backward(model, optimizers, seen, step)   # B > 1: the list of the B

``optimizers`` is a dict ``{param name: torch.optim.Adam}``, one optimiser per
parameter.  A custom strategy edits rows with the table's
``keep`` / ``take`` / ``append`` / ``set_rows`` and registers its statistics
with ``register`` / ``set_stat``; :func:`update_params` (parameters and
moments only, ids left stale) is kept for strategies written before the table.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Union

import torch

from ..config import StrategyConfig
from ..state import PrimitiveState
from .base import Strategy, Visibility, visibility
from .default import DefaultStrategy
from .mcmc import MCMCStrategy

__all__ = [
    "Strategy",
    "Visibility",
    "visibility",
    "update_params",
    "make_strategy",
    "DefaultStrategy",
    "MCMCStrategy",
    "strategy_config",
]


def update_params(
    model,
    optimizers: Dict[str, torch.optim.Optimizer],
    param_fn: Callable[[str, torch.Tensor], torch.Tensor],
    optim_fn: Callable[[str, torch.Tensor], torch.Tensor],
    names=None,
) -> None:
    """Replace parameters and remap their Adam moments row-wise
    (:meth:`splat.state.PrimitiveState.edit_params`).

    ``param_fn(name, p)`` returns the new data for parameter ``name``;
    ``optim_fn(key, v)`` returns the new value of a per-row optimiser state
    tensor ``v`` (``exp_avg``/``exp_avg_sq``), e.g. ``v[keep]`` for pruning.
    Scalar state (Adam's ``step``) is left as is.  Ids and statistics are
    not edited: with a changed row count one process renumbers the rows,
    several processes stop (:meth:`~splat.state.PrimitiveState.check_ids`);
    use the table's row edits instead.
    """
    PrimitiveState(model, optimizers).edit_params(param_fn, optim_fn, names)


def strategy_config(cfg: Union[StrategyConfig, dict]) -> StrategyConfig:
    """``cfg`` (the config's ``strategy`` section, a dict or already a
    :class:`splat.config.StrategyConfig`) as a StrategyConfig; unset fields
    take the declared defaults."""
    if isinstance(cfg, StrategyConfig):
        return cfg
    known = {f.name for f in dataclasses.fields(StrategyConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"strategy.{unknown[0]}: unknown key (expected one of {', '.join(sorted(known))})")
    return StrategyConfig(**cfg)


def make_strategy(cfg: Union[StrategyConfig, dict], scene_radius: float, seed: int = 0, group=None) -> Strategy:
    """Build the strategy named by ``cfg.name`` (``default``, ``mcmc`` or ``none``)
    from the config's ``strategy`` section (:func:`strategy_config`);
    ``seed`` keys its randomness, ``group`` (a
    :class:`splat.distributed.Group`; default: one process) is the set of
    processes whose primitives it densifies together."""
    cfg = strategy_config(cfg)
    if cfg.name == "none":
        return Strategy()
    if cfg.name == "default":
        return DefaultStrategy(cfg, scene_radius=scene_radius, seed=seed, group=group)
    if cfg.name == "mcmc":
        return MCMCStrategy(cfg, scene_radius=scene_radius, seed=seed, group=group)
    raise ValueError(f"strategy.name={cfg.name!r}: unknown strategy (expected 'default', 'mcmc' or 'none')")
