"""One optimisation step over a batch of cameras, whichever way they render.

The loss terms, the appearance correction, the backgrounds and the
reduction of the logging terms are written here once;
:mod:`splat.training.batch_rendering` renders (camera by camera or sharded)
and carries the gradients back.  A step (1-based ``step``) over
``train.batch_size`` cameras B:

1. the means' learning rate of ``step``; the batch's views
   (:func:`splat.training.views.batch_views`) and backgrounds;
2. render, loss of each camera (:func:`camera_loss` against the target over
   its background, through the view's appearance correction; with
   ``loss.multiview`` a neighbour view is rendered with each camera and the
   multi-view terms join its loss, :mod:`splat.training.multiview_step`),
   the strategy's ``step_pre_backward`` per camera, backward of the mean
   over the batch;
3. the gradient of the strategy's own loss term (``strategy.loss``, e.g.
   MCMC's regularisers) added, the appearance and pose corrections'
   gradients summed over the ranks (every rank holds them whole), the
   optimiser steps, the pose corrections' gauge fixed
   (:meth:`splat.pose_opt.PoseCorrection.fix_gauge`), the strategy's
   ``step_post_backward`` (one :class:`splat.strategy.Visibility` when
   B = 1, else the list of the B cameras').

With ``train.pose_opt`` each camera renders from its corrected pose, with
autograd to its correction (the rasterizer's exact viewmat gradients;
camera by camera, or through every rank's projection of its surfels), and
its loss gains ``train.pose_opt_reg`` |correction|^2.  With
``train.pose_opt_metric`` the first step that corrects the poses sets their
metric from the model as it is then (:meth:`BatchStep.set_pose_metric`).

The trainer then checks ids and rebalances; :meth:`StepSums.reduce` sums the
logging terms over every rank's cameras.
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import torch

from ..distributed.collectives import all_sum, all_sum_tensor
from ..distributed.group import Group
from ..distributed.sharded_model import sum_replicated_gradients
from ..losses import LOSS_TERMS, psnr, total_loss
from ..optimizers import means_lr
from ..pose_opt import image_motion_hessians, whitening
from .batch_rendering import camera_of
from .multiview_step import MULTIVIEW_TERMS, MultiViewTerms
from .resolution import CoarseViews
from .targets import camera_background, corrected, gt_image
from .views import batch_views

#: The logging terms a step reports (each present when some camera has it).
TERMS = ("loss", "psnr") + LOSS_TERMS + MULTIVIEW_TERMS


def sh_degree_at(step: int, sh_increase_every: int, max_degree: int) -> int:
    """SH degree used at ``step``: one more band every ``train.sh_increase_every`` steps."""
    return min(step // max(sh_increase_every, 1), max_degree)


def camera_loss(out, gt: torch.Tensor, frame, step: int, loss_cfg: Dict, device, viewmat=None):
    """(loss, logging terms) of one camera's render ``out`` against ``gt`` [H, W, 3];
    ``viewmat``: the pose it was rendered from (default: the frame's).

    With ``frame.loss_mask`` (``data.masks=ignore``) render and target are
    both multiplied by it, so masked-out pixels add nothing to the
    photometric loss and get no gradient from it (the geometry regularisers
    still see every pixel)."""
    if frame.loss_mask is not None:
        m = frame.loss_mask.to(device)[..., None]  # [H, W, 1]
        out = dataclasses.replace(out, rgb=out.rgb * m)
        gt = gt * m
    viewmat = frame.viewmat if viewmat is None else viewmat
    return total_loss(out, gt, frame.K.to(device), viewmat.to(device), step, loss_cfg)


def apply_gradients(optimizers: Dict) -> None:
    """Apply and clear the gradients of every parameter."""
    for opt in optimizers.values():
        opt.step()
        opt.zero_grad(set_to_none=True)


@dataclasses.dataclass
class StepSums:
    """This rank's share of a step's logging terms: per term, the sum over
    the cameras it rendered and how many had it; the batch size; the bytes
    it exchanged."""

    sums: Dict[str, float]
    present: Dict[str, int]
    batch: int
    bytes_exchanged: float = 0.0

    def reduce(self, num_local: int, group: Group) -> tuple[dict, int, float]:
        """(terms averaged over the batch, primitives over all ranks given
        this rank's ``num_local``, bytes exchanged by all ranks): one
        reduction over the ranks.  Collective."""
        total = all_sum(
            [self.sums[k] for k in TERMS] + [self.present[k] for k in TERMS] + [num_local, self.bytes_exchanged], group
        )
        terms = {k: total[j] / self.batch for j, k in enumerate(TERMS) if total[len(TERMS) + j] > 0}
        return terms, int(total[-2]), total[-1]


class BatchStep:
    """Steps of one run: ``cfg`` (the whole config), ``scene`` (its training
    views), ``background`` [3] (``data.background``), ``rendering`` (a
    :mod:`splat.training.batch_rendering` implementation), ``group``, ``pose``
    (a :class:`splat.pose_opt.PoseCorrection`, or None)."""

    def __init__(
        self,
        cfg: Dict,
        scene,
        background: torch.Tensor,
        scene_radius: float,
        device,
        rendering,
        group: Group,
        pose=None,
    ):
        self.cfg, self.scene, self.background, self.pose = cfg, scene, background, pose
        self.scene_radius, self.device, self.rendering, self.group = scene_radius, device, rendering, group
        self.views = CoarseViews(scene, cfg["train"], announce=group.is_main)
        mv = cfg["loss"]["multiview"]
        self.multiview = (
            MultiViewTerms(mv, scene.train, scene_radius, cfg["seed"], announce=group.is_main)
            if mv["enabled"]
            else None
        )

    def set_means_lr(self, optimizers: Dict, step: int) -> None:
        """The means' learning rate of ``step``; with ``train.pose_opt`` the pose
        corrections' too, decaying to 1 % over the run as gsplat's does (a
        constant rate leaves the poses jittering by about the rate)."""
        train = self.cfg["train"]
        lr, iterations = train["lr"], train["iterations"]
        for g in optimizers["means"].param_groups:
            g["lr"] = means_lr(step, iterations, lr["means"], lr["means_final"]) * self.scene_radius
        start = train["pose_opt_from"]
        for g in optimizers["pose"].param_groups if "pose" in optimizers else ():
            g["lr"] = means_lr(step - start, iterations - start, train["pose_opt_lr"], 0.01 * train["pose_opt_lr"])

    @torch.no_grad()
    def set_pose_metric(self, model) -> None:
        """The pose corrections' metric (:mod:`splat.pose_opt`, "The metric")
        from the primitives of every rank's shard, seen by the train cameras
        as given; the same on every rank."""
        frames = self.scene.train
        H, total = image_motion_hessians(
            model.means,
            model.opacities,
            torch.stack([f.viewmat for f in frames]),
            torch.stack([f.K for f in frames]),
            [(int(f.width), int(f.height)) for f in frames],
            self.scene_radius,
            near=self.cfg["render"]["near"],
            far=self.cfg["render"]["far"],
        )
        # Before the first corrected step RowAdam has no moments, so none is in the old coordinates
        # (a run folder refuses to resume under a config that switches the option).
        self.pose.set_metric(whitening(all_sum_tensor(H, self.group), all_sum_tensor(total, self.group)))

    def __call__(self, model, optimizers: Dict, strategy, appearance, step: int) -> StepSums:
        """Steps 1-3 of the module doc; returns this rank's :class:`StepSums`."""
        cfg = self.cfg
        frames = self.views.at(step)
        batch = int(cfg["train"]["batch_size"])
        self.set_means_lr(optimizers, step)
        views = batch_views(cfg["seed"], step, batch, len(frames))
        backgrounds = [
            camera_background(cfg["data"], cfg["seed"], frames[i], step, b, self.background)
            for b, i in enumerate(views)
        ]
        cameras = [camera_of(frames[i], bg, self.device) for i, bg in zip(views, backgrounds)]
        pose = self.pose if step >= self.cfg["train"]["pose_opt_from"] else None  # None: corrections are zero
        if pose is not None and self.cfg["train"]["pose_opt_metric"] and not pose.has_metric:
            self.set_pose_metric(model)
        for camera, i in zip(cameras, views if pose is not None else ()):
            camera.viewmat = pose.viewmat(i, camera.viewmat)  # one lookup per camera: a graph each
        mv = self.multiview if self.multiview is not None and self.multiview.active(step) else None
        partners = mv.partners(step, views) if mv is not None else [None] * batch
        partner_cameras = [
            None if p is None else mv.partner_camera(camera_of(frames[p], bg, self.device))
            for p, bg in zip(partners, backgrounds)
        ]
        for camera, p in zip(partner_cameras, partners if pose is not None else ()):
            if camera is not None:  # the partner as the run now places it; its pose gets no gradient here
                camera.viewmat = pose.viewmat(p, camera.viewmat).detach()
        sums, present = dict.fromkeys(TERMS, 0.0), dict.fromkeys(TERMS, 0)

        def loss_of(b: int, out, partner_out=None) -> torch.Tensor:
            frame = frames[views[b]]
            geometry = out
            out = corrected(appearance, out, views[b], frame, backgrounds[b])
            gt = gt_image(frame, backgrounds[b], self.background).to(self.device)
            loss, terms = camera_loss(out, gt, frame, step, cfg["loss"], self.device, cameras[b].viewmat)
            if partner_out is not None:
                poses = (cameras[b].viewmat, partner_cameras[b].viewmat)  # the terms detach them
                mv_loss, mv_terms = mv.loss(
                    geometry, partner_out, frames, views[b], partners[b], poses, appearance, step, b, self.device
                )
                loss = loss + mv_loss
                terms.update(mv_terms)
            terms.update(loss=float(loss.detach()), psnr=psnr(out.rgb, gt))
            if pose is not None and cfg["train"]["pose_opt_reg"] > 0:  # on the camera's rank: counted once
                loss = loss + cfg["train"]["pose_opt_reg"] * pose.penalty(views[b])
            for k, v in terms.items():
                sums[k] += v
                present[k] += 1
            return loss

        seen, exchanged = self.rendering.backward(
            model,
            cameras,
            sh_degree_at(step, cfg["train"]["sh_increase_every"], model.sh_degree),
            loss_of,
            lambda camera: strategy.step_pre_backward(model, optimizers, camera, step),
            partner_cameras if mv is not None else None,
        )
        extra = strategy.loss(model)
        if extra is not None:
            extra.backward()
        if appearance is not None:
            sum_replicated_gradients(appearance, self.group, sparse=True)  # SparseAdam's row gradients
        if pose is not None:
            # Every rank's surfels add to a camera's pose gradient: the sum, the same on every rank.
            sum_replicated_gradients(pose, self.group, sparse=True)
        self.apply_gradients(optimizers)
        if pose is not None:
            pose.fix_gauge()
        strategy.step_post_backward(model, optimizers, seen[0] if batch == 1 else seen, step)
        return StepSums(sums, present, batch, exchanged)

    #: Replaceable (tests read the gradients a step would apply).
    apply_gradients = staticmethod(apply_gradients)
