"""``data.background: auto``: the render's background from the photos.

A capture against a uniform backdrop (a studio sweep, a rendered sky, a
turntable's white) shows one colour wherever there is nothing.  If the
render's empty background is a different colour, primitives must paint the
backdrop: the trainer grows far "sky" surfels, and where they meet an
object's silhouette they blend into its pixels and pull the depth there
back (still_life, whose sky is (237, 243, 255): the test depth error near
silhouettes falls by two thirds with the sky's colour as the background,
docs/results.md).  ``auto`` takes that colour from the training photos:

- The photos' most frequent 8-bit colour, if the pixels within
  :data:`splat.data.initial_points.BACKGROUND_TOLERANCE` of it (every
  channel) are at least :data:`AUTO_MIN_SHARE` of the pixels the loss sees
  (``loss_mask`` > 0).  Real photographs without a backdrop rarely repeat
  one colour that exactly, except where they clip to white (the default
  anyway) or black.
- Otherwise white, the usual default.
- White, without looking, where the loader itself composites over the
  background: RGBA photos (composited over white, NeRF-synthetic's
  convention) and ``data.masks: background``.

The chosen colour goes into the run's ``config.yaml``: ``render.py``, the
viewer, meshing and a resumed run read it from there, never again from the
photos.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, TextIO

import torch

from .initial_points import BACKGROUND_TOLERANCE
from .types import SceneData

__all__ = ["AUTO_MIN_SHARE", "WHITE", "backdrop_colour", "configured_background", "resolve_background"]

#: The share of the loss's pixels one colour must cover to be taken as the backdrop.
AUTO_MIN_SHARE = 0.10
WHITE = [1.0, 1.0, 1.0]
#: Pixels read per image when looking for the backdrop: a 1-in-s grid in each direction keeps at most
#: this many (a colour covering 10 % of a photo is found the same on the grid).
_SAMPLES_PER_IMAGE = 65536


def _grid_sample(t: torch.Tensor) -> torch.Tensor:
    """Every s-th row and column of ``t`` [H, W, ...], s the smallest stride keeping <= _SAMPLES_PER_IMAGE pixels."""
    H, W = t.shape[:2]
    stride = 1
    while (-(-H // stride)) * (-(-W // stride)) > _SAMPLES_PER_IMAGE:
        stride += 1
    return t[::stride, ::stride]


def backdrop_colour(frames: Sequence) -> tuple[List[float], float]:
    """The most frequent 8-bit colour of ``frames``' images and the share of
    their pixels (those with ``loss_mask`` > 0, where a frame has one)
    within :data:`BACKGROUND_TOLERANCE` of it: ``([r, g, b] in [0, 1], share)``."""
    pixels = []
    for f in frames:
        rgb = _grid_sample(f.image).reshape(-1, 3)  # [P, 3]
        if f.loss_mask is not None:
            rgb = rgb[_grid_sample(f.loss_mask).reshape(-1) > 0]
        pixels.append(rgb)
    rgb = torch.cat(pixels) if pixels else torch.zeros(0, 3)
    if rgb.shape[0] == 0:
        return list(WHITE), 0.0
    q = (rgb.clamp(0, 1) * 255).round().to(torch.int64)  # [P, 3]
    codes = (q[:, 0] << 16) | (q[:, 1] << 8) | q[:, 2]  # [P]
    values, counts = torch.unique(codes, return_counts=True)
    mode = int(values[counts.argmax()])
    colour = torch.tensor([(mode >> 16) & 255, (mode >> 8) & 255, mode & 255], dtype=torch.float32) / 255
    near = ((rgb - colour).abs().amax(-1) <= BACKGROUND_TOLERANCE).float().mean()
    return colour.tolist(), float(near)


def resolve_background(data_cfg: dict, scene: SceneData, log: Optional[TextIO] = None) -> List[float]:
    """``data.background`` as an RGB list: itself if it is one, else the
    ``auto`` rule of this module's doc on ``scene``'s training frames (and
    one line on ``log`` saying what it chose)."""
    if data_cfg["background"] != "auto":
        return configured_background(data_cfg)
    if data_cfg["masks"] == "background" or any(f.mask is not None for f in scene.train):
        chosen, why = list(WHITE), "the loader composites over white"
    else:
        colour, share = backdrop_colour(scene.train)
        chosen = colour if share >= AUTO_MIN_SHARE else list(WHITE)
        why = f"{share:.0%} of the photos' pixels are {_in_8_bits(colour)}"
    if log is not None:
        print(f"data.background auto: {_in_8_bits(chosen)} / 255: {why}", file=log)
    return chosen


def _in_8_bits(colour: Sequence[float]) -> str:
    """``(r, g, b)`` of a colour in [0, 1], as 8-bit values."""
    return "(" + ", ".join(str(round(c * 255)) for c in colour) + ")"


def configured_background(data_cfg: dict) -> List[float]:
    """The colour a reader of a config renders over (render.py, the viewer, meshing): the list a trained
    run's config.yaml holds; ``auto`` only where no training resolved it (a config file given to the
    viewer without a run), which renders over white without reading the photos."""
    background = data_cfg["background"]
    return list(WHITE) if background == "auto" else [float(c) for c in background]
