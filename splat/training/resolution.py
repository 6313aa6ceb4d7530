"""Coarse-to-fine training (``train.coarse_factor``, ``train.coarse_until``):
the first steps render and compare area-downscaled images, as DashGaussian
schedules resolution, so that the early steps, which only place the scene's
low frequencies, cost a fraction of a full-resolution step.

The factor starts at ``coarse_factor`` (a power of 2) and halves in equal
spans of steps until ``coarse_until``, the first step at full resolution:
factor 4 until 600 renders steps 1-300 at 1/4, 301-599 at 1/2.  A coarse
view is the loader's own downscale of the frame (``area_downscale`` of every
image and mask, K divided: exact with pixel centres at j + 0.5, see
:func:`splat.data.types.scaled_K`), made once per view and factor.  The
densification statistics are already resolution-free (normalised-device
gradients, screen sizes as fractions of the image), so the strategy needs no
change."""

from __future__ import annotations

import dataclasses
from typing import Dict

from ..data.types import area_downscale


def resolution_factor(step: int, coarse_factor: int, coarse_until: int) -> int:
    """The downscale factor of 1-based ``step``: ``coarse_factor`` halved
    ``log2(coarse_factor)`` times in equal spans of steps ``1 .. coarse_until - 1``;
    1 from ``coarse_until`` on."""
    if coarse_factor <= 1 or step >= coarse_until:
        return 1
    levels = coarse_factor.bit_length() - 1  # log2: the config checks that it is a power of 2
    span = (step - 1) * levels // max(coarse_until - 1, 1)
    return coarse_factor >> min(span, levels - 1)


def _downscale_map(x, s: int):
    return None if x is None else area_downscale(x[..., None], s)[..., 0]


def coarse_frame(frame, s: int):
    """``frame`` [H, W] as the loader would give it with ``downscale`` s times
    larger: images and masks area-averaged, K's first two rows divided by s."""
    if s == 1:
        return frame
    K = frame.K.clone()  # [3, 3]
    K[:2] /= s
    image = area_downscale(frame.image, s)  # [H // s, W // s, 3]
    return dataclasses.replace(
        frame,
        image=image,
        mask=_downscale_map(frame.mask, s),
        loss_mask=_downscale_map(frame.loss_mask, s),
        object_mask=_downscale_map(frame.object_mask, s),
        K=K,
        width=int(image.shape[1]),
        height=int(image.shape[0]),
    )


class CoarseViews:
    """The training views at the factor of each step, each coarse view made
    once (``train_cfg``: the config's ``train`` section)."""

    def __init__(self, frames, train_cfg: Dict):
        self.frames, self.factor, self.until = frames, int(train_cfg["coarse_factor"]), int(train_cfg["coarse_until"])
        self._cache: Dict[tuple, object] = {}

    def at(self, step: int):
        """The list of training views of ``step``: the frames themselves at full resolution."""
        s = resolution_factor(step, self.factor, self.until)
        if s == 1:
            self._cache.clear()  # never needed again: the factor only falls
            return self.frames
        return _LazyViews(self, s)

    def view(self, index: int, s: int):
        key = (index, s)
        if key not in self._cache:
            self._cache[key] = coarse_frame(self.frames[index], s)
        return self._cache[key]


class _LazyViews:
    """A read-only list of coarse views, each made when first indexed."""

    def __init__(self, views: CoarseViews, s: int):
        self.views, self.s = views, s

    def __len__(self) -> int:
        return len(self.views.frames)

    def __getitem__(self, index: int):
        return self.views.view(index, self.s)
