"""Densification strategies: when and how surfels are added and removed.

A strategy sees the model, its optimisers and each step's rasterizer output,
and may replace the model's parameters (clone / split / prune / reset).  It
owns every piece of state it needs (gradient accumulators, ...) and exposes it
through ``state_dict`` / ``load_state_dict`` so checkpoints can resume it.

The trainer calls, every step (:class:`splat.training.step.BatchStep`),
with one :class:`Visibility` per camera of the step's B cameras
(``train.batch_size``), whether they render one by one or together::

    render the B cameras, their losses
    strategy.step_pre_backward(model, optimizers, seen, step)    # per camera
    backward of the mean loss (camera by camera: each before the next renders)
    optimizer steps
    strategy.step_post_backward(model, optimizers, seen, step)   # B > 1: the list of the B

``optimizers`` is a dict ``{param name: torch.optim.Adam}``, one optimiser per
parameter, so a strategy can edit one parameter's Adam moments at a time.
Use :func:`update_params` to change parameters: it keeps the optimiser state
consistent with the new rows.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple

import torch
from torch import nn

__all__ = ["Strategy", "Visibility", "visibility", "update_params", "make_strategy"]


class Visibility(NamedTuple):
    """What densification reads of one camera's render: ``means2d`` [N, 2]
    (its ``.grad`` after backward), ``radii`` [N] (0: not drawn) and the
    image size.  :func:`visibility` makes one from a rasterizer output; the
    multi-process trainer makes them from :func:`splat.distributed.render_sharded`."""

    means2d: torch.Tensor
    radii: torch.Tensor
    width: int
    height: int


def visibility(out) -> Visibility:
    """``out`` as a :class:`Visibility` (a rasterizer output or one already)."""
    if isinstance(out, Visibility):
        return out
    return Visibility(out.means2d, out.radii, int(out.rgb.shape[1]), int(out.rgb.shape[0]))


class Strategy:
    """Base class: does nothing (a fixed set of surfels)."""

    def row_state(self, n: int) -> Dict[str, torch.Tensor]:
        """The strategy's per-surfel tensors ([n, ...]) that must move with
        their surfels between processes (issue 23)."""
        return {}

    def set_row_state(self, rows: Dict[str, torch.Tensor]) -> None:
        """Takes back :meth:`row_state`'s tensors after their rows moved."""

    def step_pre_backward(self, model, optimizers: Dict, out, step: int) -> None:
        """Called after rendering, before ``loss.backward()``: ``out`` is the
        camera's :class:`Visibility` (:mod:`splat.training.batch_rendering`)."""

    def step_post_backward(self, model, optimizers: Dict, out, step: int) -> None:
        """Called after the optimiser step with the camera's
        :class:`Visibility`; ``out.means2d.grad`` is populated.  With
        ``train.batch_size`` B > 1, ``out`` is the list of the step's B
        visibilities, and each gradient is that of its camera's loss over B."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@torch.no_grad()
def update_params(
    model,
    optimizers: Dict[str, torch.optim.Optimizer],
    param_fn: Callable[[str, torch.Tensor], torch.Tensor],
    optim_fn: Callable[[str, torch.Tensor], torch.Tensor],
    names=None,
) -> None:
    """Replace parameters and remap their Adam moments row-wise.

    ``param_fn(name, p)`` returns the new data for parameter ``name``;
    ``optim_fn(key, v)`` returns the new value of a per-row optimiser state
    tensor ``v`` (``exp_avg``/``exp_avg_sq``), e.g. ``v[keep]`` for pruning or
    ``torch.cat([v, zeros])`` for growth.  Scalar state (Adam's ``step``) is
    left as is.
    """
    names = list(model.params.keys()) if names is None else names
    for name in names:
        old = model.params[name]
        new = nn.Parameter(param_fn(name, old.data).contiguous(), requires_grad=old.requires_grad)
        opt = optimizers.get(name) if optimizers is not None else None
        if opt is not None:
            group = opt.param_groups[0]
            assert len(group["params"]) == 1 and group["params"][0] is old, name
            state = opt.state.pop(old, None)
            if state is not None:
                for key, v in list(state.items()):
                    if key != "step" and torch.is_tensor(v) and v.dim() > 0:
                        state[key] = optim_fn(key, v).contiguous()
                opt.state[new] = state
            group["params"][0] = new
        model.params[name] = new


def make_strategy(cfg: dict, scene_radius: float, seed: int = 0, group=None) -> Strategy:
    """Build the strategy named by ``cfg["name"]`` (``default`` or ``none``);
    ``seed`` keys its randomness, ``group`` (a
    :class:`splat.distributed.Group`; default: one process) is the set of
    processes whose surfels it densifies together."""
    name = cfg.get("name", "default")
    if name == "none":
        return Strategy()
    if name == "default":
        from .default import DefaultStrategy

        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        return DefaultStrategy(scene_radius=scene_radius, seed=seed, group=group, **kwargs)
    raise ValueError(f"unknown strategy {name!r} (expected 'default' or 'none')")
