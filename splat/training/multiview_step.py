"""The multi-view consistency terms of a training step (``loss.multiview``).

Set up once per run: each train camera's neighbours from the poses
(:func:`splat.neighbour_views.neighbour_views`, distances in units of the
scene radius), with one warning line naming the cameras that have none.
Each ``loss.multiview.every``-th step from ``loss.multiview.start`` on, every batch camera with
neighbours gets one of them as its *partner*, drawn by a generator keyed by
(seed, step, slot): the same on a resumed run.  The partner is rendered with
the camera (:mod:`splat.training.batch_rendering`), and the camera's loss
gains ``geo_lambda L_geo + ncc_lambda L_ncc`` (:func:`splat.multiview.multiview_losses`).
The terms read only the partner's depth (its photo is the data's), so it
may render at 1/``neighbour_downscale`` of the size (:meth:`MultiViewTerms.partner_camera`)
and, with ``neighbour_gradient`` false, forward only: its maps are detached,
so autograd never reaches its raster node.

With ``train.pose_opt`` both cameras render from, and the homographies
use, the poses as corrected this step, held constant by the terms: the
corrections learn from the photometric loss alone, as without the terms.
(The neighbour lists come from the given poses, which a correction of a
fraction of a degree does not change.)

Photos under one appearance: with ``train.appearance=affine`` a photo i
is ``A_i c + b_i`` of the scene's colour c, so both photos are taken back to
c, ``(photo - b_i) A_i^-1`` (the corrections as they are this step, without
gradient), before the grey patches are compared: an exposure or white
balance difference between the two photos does not read as geometry.
(NCC alone is blind to a gain and offset of the grey level, not to a
white-balance change, which changes the grey image non-uniformly.)

On several processes a partner renders on its camera's rank
(:class:`splat.training.batch_rendering.ShardedRendering`), and every rank
loads every training image (:func:`splat.data.load_scene_from_config`), so
both renders and both photos of a camera's terms are on the rank that takes
its loss: nothing more travels than the partner's surfel records, as for
any camera.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..data.types import downscaled_K
from ..distributed.sharded_render import Camera
from ..multiview import ViewGeometry, grey, multiview_losses
from ..neighbour_views import lonely_cameras_message, neighbour_views

#: The logging terms the multi-view step adds.
MULTIVIEW_TERMS = ("mv_geo", "mv_ncc")
#: Stream of the keyed generators (partner and pixel draws), apart from other seeded draws.
MULTIVIEW_STREAM = 41


class MultiViewTerms:
    """The multi-view terms of a run (module doc): ``mv_cfg`` is ``loss.multiview``."""

    def __init__(self, mv_cfg: Dict, frames: Sequence, scene_radius: float, seed: int, announce: bool = True):
        self.cfg, self.seed = mv_cfg, int(seed)
        viewmats = torch.stack([f.viewmat for f in frames])  # [N, 4, 4]
        self.neighbours: List[List[int]] = neighbour_views(
            viewmats,
            mv_cfg["max_angle"],
            mv_cfg["min_distance"] * scene_radius,
            mv_cfg["max_distance"] * scene_radius,
            mv_cfg["max_neighbours"],
        )
        limits = (
            f"within {mv_cfg['max_angle']:g} deg and {mv_cfg['min_distance']:g}-{mv_cfg['max_distance']:g} "
            "x the scene radius"
        )
        message = lonely_cameras_message([f.stem for f in frames], self.neighbours, limits)
        if message is not None and announce:
            print(message, file=sys.stderr)

    def active(self, step: int) -> bool:
        """Whether ``step`` (1-based) has the multi-view terms."""
        c = self.cfg
        on = bool(c["enabled"]) and step >= c["start"] and (step - c["start"]) % c["every"] == 0
        return on and (c["geo_lambda"] > 0 or c["ncc_lambda"] > 0)

    def _rng(self, step: int, slot: int, draw: int) -> np.random.Generator:
        """The generator of ``draw`` (0: the partner, 1: the pixels) of batch ``slot`` at ``step``."""
        return np.random.default_rng([self.seed, MULTIVIEW_STREAM, int(step), int(slot), int(draw)])

    def partners(self, step: int, views: Sequence[int]) -> List[Optional[int]]:
        """Per batch slot, the train index of its partner this step (None: no neighbour)."""
        out: List[Optional[int]] = []
        for slot, i in enumerate(views):
            nb = self.neighbours[i]
            out.append(int(nb[self._rng(step, slot, 0).integers(len(nb))]) if nb else None)
        return out

    def partner_camera(self, camera: Camera) -> Camera:
        """``camera`` at 1/``neighbour_downscale`` of its size, K's first two
        rows divided (exact with pixel centres at j + 0.5): the terms read
        only the partner's depth, bilinearly, at continuous pixels."""
        s = int(self.cfg["neighbour_downscale"])
        if s == 1:
            return camera
        return dataclasses.replace(
            camera, K=downscaled_K(camera.K, s), width=max(camera.width // s, 1), height=max(camera.height // s, 1)
        )

    @staticmethod
    def canonical_grey(frame, index: int, appearance, device) -> torch.Tensor:
        """Train photo ``index`` (``frame``, at this step's resolution) [H, W, 1]
        in grey, under no appearance correction (module doc)."""
        img = frame.image.to(device)  # [H, W, 3]
        if appearance is not None:
            with torch.no_grad():
                A = appearance.matrices()[index]  # [3, 3]
                b = appearance.offset.detach()[index]  # [3]
                img = (img - b) @ torch.linalg.inv(A).T
        return grey(img)

    def loss(
        self, out, partner_out, frames, index: int, partner: int, viewmats, appearance, step: int, slot: int, device
    ) -> tuple[torch.Tensor, Dict[str, float]]:
        """(geo_lambda L_geo + ncc_lambda L_ncc, logging terms) of train view
        ``index`` rendered as ``out`` with neighbour ``partner`` rendered as
        ``partner_out``, from the world -> camera poses ``viewmats`` (the two
        [4, 4] they were rendered from: with ``train.pose_opt`` the corrected
        ones, which the terms treat as constants); ``frames``: the train views
        at this step's resolution (coarse-to-fine: their photos and K, so that
        ``loss.multiview.pixel_noise`` and ``patch_size`` are in the pixels of
        the images compared)."""
        c = self.cfg
        f, g = frames[index], frames[partner]
        ref_viewmat, nb_viewmat = (v.detach().to(device) for v in viewmats)
        ref = ViewGeometry(out.depth, out.normal, out.alpha, f.K.to(device), ref_viewmat)
        nb_maps = (partner_out.depth, partner_out.normal, partner_out.alpha)
        if not c["neighbour_gradient"]:  # unreached by the loss, the partner's render has no backward
            nb_maps = tuple(t.detach() for t in nb_maps)
        nb = ViewGeometry(*nb_maps, g.K.to(device), nb_viewmat)
        H, W = out.depth.shape
        order = torch.from_numpy(self._rng(step, slot, 1).permutation(H * W)).to(device)
        geo, ncc, _ = multiview_losses(
            ref,
            nb,
            self.canonical_grey(f, index, appearance, device),
            self.canonical_grey(g, partner, appearance, device),
            order,
            num_pixels=c["num_pixels"],
            patch_size=c["patch_size"],
            pixel_noise=c["pixel_noise"],
            min_patch_std=c["min_patch_std"],
            geo_pixels=c["geo_pixels"],
        )
        loss = c["geo_lambda"] * geo + c["ncc_lambda"] * ncc
        return loss, {"mv_geo": float(geo.detach()), "mv_ncc": float(ncc.detach())}
