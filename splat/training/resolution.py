"""Coarse-to-fine training (``train.coarse_factor``, ``train.coarse_until``):
the first steps render and compare area-downscaled images, as DashGaussian
schedules resolution, so that the early steps, which only place the scene's
low frequencies, cost a fraction of a full-resolution step.

The factor starts at ``coarse_factor`` (a power of 2) and halves in equal
spans of steps until ``coarse_until``, the first step at full resolution:
factor 4 until 600 renders steps 1-300 at 1/4, 301-599 at 1/2.  Full
resolution comes at the latest at the middle of the run
(:func:`full_resolution_step`), so that a run shortened with
``--iterations`` still spends half its steps at full resolution.  A coarse
view is the loader's own downscale of the frame (``area_downscale`` of every
image and mask, K divided: exact with pixel centres at j + 0.5, see
:func:`splat.data.types.downscaled_K`), made once per view and factor.  The
densification statistics are already resolution-free (normalised-device
gradients, screen sizes as fractions of the image), so the strategy needs no
change."""

from __future__ import annotations

import dataclasses
import sys
from typing import Dict

from ..data.types import area_downscale, downscaled_K


def resolution_factor(step: int, coarse_factor: int, coarse_until: int) -> int:
    """The downscale factor of 1-based ``step``: ``coarse_factor`` halved
    ``log2(coarse_factor)`` times in equal spans of steps ``1 .. coarse_until - 1``;
    1 from ``coarse_until`` on."""
    if coarse_factor <= 1 or step >= coarse_until:
        return 1
    levels = coarse_factor.bit_length() - 1  # log2: the config checks that it is a power of 2
    span = (step - 1) * levels // max(coarse_until - 1, 1)
    return coarse_factor >> min(span, levels - 1)


def full_resolution_step(train_cfg: Dict) -> int:
    """The first full-resolution step of a run with the ``train`` section
    ``train_cfg``: ``train.coarse_until``, or the middle of the run,
    ``ceil(train.iterations / 2)``, when that comes first."""
    return min(int(train_cfg["coarse_until"]), (int(train_cfg["iterations"]) + 1) // 2)


def _downscale_map(x, s: int):
    return None if x is None else area_downscale(x[..., None], s)[..., 0]


def coarse_frame(frame, s: int):
    """``frame`` [H, W] as the loader would give it with ``downscale`` s times
    larger: images and masks area-averaged, K's first two rows divided by s."""
    if s == 1:
        return frame
    image = area_downscale(frame.image, s)  # [H // s, W // s, 3]
    return dataclasses.replace(
        frame,
        image=image,
        mask=_downscale_map(frame.mask, s),
        loss_mask=_downscale_map(frame.loss_mask, s),
        object_mask=_downscale_map(frame.object_mask, s),
        K=downscaled_K(frame.K, s),
        width=int(image.shape[1]),
        height=int(image.shape[0]),
    )


class CoarseViews:
    """The training views of ``scene`` (read at every step: callers may
    replace ``scene.train``) at the factor of each step, each coarse view
    made once (``train_cfg``: the config's ``train`` section).  ``announce``:
    print one line when the middle of the run cuts ``train.coarse_until`` short."""

    def __init__(self, scene, train_cfg: Dict, announce: bool = False):
        self.scene, self.factor = scene, int(train_cfg["coarse_factor"])
        self.until = full_resolution_step(train_cfg)
        if announce and self.factor > 1 and self.until < int(train_cfg["coarse_until"]):
            print(
                f"train.coarse_until={train_cfg['coarse_until']} is past the middle of "
                f"train.iterations={train_cfg['iterations']}: full resolution from step {self.until}",
                file=sys.stderr,
            )
        self._cache: Dict[tuple, tuple] = {}  # (id(frame), s) -> (frame, its coarse view)

    def at(self, step: int):
        """The list of training views of ``step``: ``scene.train`` itself at full resolution."""
        s = resolution_factor(step, self.factor, self.until)
        if s == 1:
            self._cache.clear()  # never needed again: the factor only falls
            return self.scene.train
        return _LazyViews(self, self.scene.train, s)

    def view(self, frame, s: int):
        entry = self._cache.get((id(frame), s))
        if entry is None or entry[0] is not frame:  # the frame is kept, so its id is not reused
            entry = self._cache[(id(frame), s)] = (frame, coarse_frame(frame, s))
        return entry[1]


class _LazyViews:
    """A read-only list of coarse views of ``frames``, each made when first indexed."""

    def __init__(self, views: CoarseViews, frames, s: int):
        self.views, self.frames, self.s = views, frames, s

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index: int):
        return self.views.view(self.frames[index], self.s)
