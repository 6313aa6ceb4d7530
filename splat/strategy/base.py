"""The strategy interface: hooks the trainer calls around each step, and
what they read of a render (:class:`Visibility`)."""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch

from ..state import PrimitiveState

__all__ = ["Strategy", "Visibility", "visibility"]


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
    """Base class: does nothing (a fixed set of primitives).

    A strategy edits rows only through its table, ``self.state`` (a
    :class:`splat.state.PrimitiveState`, given by :meth:`bind`), and keeps
    its per-row statistics there (:meth:`~splat.state.PrimitiveState.register`),
    so that they move with their rows between processes and are re-split
    when a run resumes on another number of processes.  Everything else it
    saves through :meth:`state_dict`."""

    state: Optional[PrimitiveState] = None

    def bind(self, state: PrimitiveState) -> None:
        """Called by the trainer before the first step with the run's table;
        a strategy registers its per-row statistics here."""
        self.state = state

    def table(self, model, optimizers: Dict) -> PrimitiveState:
        """The bound table, or (hooks called outside a trainer, or on another
        model) a new one over ``model`` and ``optimizers``, bound now."""
        if self.state is None or self.state.model is not model or self.state.optimizers is not optimizers:
            self.bind(PrimitiveState(model, optimizers))
        return self.state

    def step_pre_backward(self, model, optimizers: Dict, out, step: int) -> None:
        """Called after rendering, before ``loss.backward()``: ``out`` is the
        camera's :class:`Visibility` (:mod:`splat.training.batch_rendering`)."""

    def loss(self, model) -> Optional[torch.Tensor]:
        """An extra loss term on the primitives (a regulariser), whose gradient
        is added to the step's before the optimiser steps; None: none.  Called
        on every rank once per step (it may be collective)."""
        return None

    def step_post_backward(self, model, optimizers: Dict, out, step: int) -> None:
        """Called after the optimiser step with the camera's
        :class:`Visibility`; ``out.means2d.grad`` is populated.  With
        ``train.batch_size`` B > 1, ``out`` is the list of the step's B
        visibilities, and each gradient is that of its camera's loss over B."""

    def state_dict(self) -> dict:
        """The strategy's state other than its per-row statistics (those are
        the table's)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
