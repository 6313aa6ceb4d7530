"""What one training camera's loss compares: its render, through the view's
appearance correction, and its photo, both over the step's background."""

from __future__ import annotations

import dataclasses
from typing import Dict

import torch

from ..keyed_random import BACKGROUND_STREAM, keyed_uniform


def camera_background(data_cfg: Dict, seed: int, frame, step: int, slot: int, default: torch.Tensor) -> torch.Tensor:
    """The background [3] of camera ``slot`` of ``step``: ``default`` (the
    configured ``data.background``), or with ``data.random_background`` and
    a mask a random colour keyed by (seed, step, slot), the same on any
    number of processes."""
    if data_cfg["random_background"] and frame.mask is not None:
        key = torch.tensor([[step, slot]], dtype=torch.int64)
        return keyed_uniform(seed, BACKGROUND_STREAM, key, 3)[0].float()
    return default


def gt_image(frame, background: torch.Tensor, cfg_background: torch.Tensor) -> torch.Tensor:
    """Target image [H, W, 3] over ``background``.  Frames are composited over
    the configured background by the loader; with a mask we re-composite."""
    if frame.mask is None or torch.equal(background, cfg_background):
        return frame.image
    a = frame.mask[..., None]  # [H, W, 1]
    return frame.image + (1.0 - a) * (background - cfg_background).view(1, 1, 3)


def corrected(appearance, out, index: int, frame, background: torch.Tensor):
    """``out`` through train view ``index``'s correction by ``appearance``
    (a :class:`splat.appearance.AffineAppearance`, or None: ``out`` as it is)."""
    if appearance is None:
        return out
    # With a mask the loader painted the background into the target, so
    # the photo's exposure applies to the scene only; without one every
    # pixel is photographed content (an uncovered one too).
    covered = (out.alpha, background) if frame.mask is not None else ()
    return dataclasses.replace(out, rgb=appearance(out.rgb, index, *covered))
