"""The rendering seam of a training step: a batch of cameras rendered, each
camera's loss taken, and the gradients carried back to the parameters.

Two implementations, one interface (:meth:`backward` for a step,
:meth:`render_views` for evaluation):

* :class:`PerCameraRendering`: :func:`splat.model_render.render_frame`
  camera by camera; each camera's backward runs before the next one renders,
  so memory is that of one camera.  3D Gaussians and
  ``render.backend=torch``; one process.
* :class:`ShardedRendering`: :func:`splat.distributed.render_sharded`
  renders the whole batch from every rank's shard (camera i, and its
  partner, on rank i mod N; one process renders them all) and one backward carries each
  surfel's gradient back to its owner, summed over the cameras in the same
  order on any number of processes.  Memory: the batch's renders at once.

Both hand the strategy hooks one :class:`splat.strategy.Visibility` per
camera, in batch order.  With ``loss.multiview`` a camera may have a
*partner* (a neighbour view, :mod:`splat.training.multiview_step`): it is
rendered with the camera, its render is handed to the camera's loss and
gradients flow through both; a partner is no camera of the batch (no
photometric loss, no densification statistics of its own).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch

from ..distributed.group import Group
from ..distributed.sharded_model import render_model
from ..distributed.sharded_render import Camera, camera_rank
from ..model import GaussianModel
from ..model_render import render_frame
from ..strategy import Visibility, visibility
from .capability import renders_sharded

#: ``loss_of(slot, out, partner_out)``: the loss (a scalar tensor) of the
#: batch's camera ``slot`` rendered as ``out``; ``partner_out``: the render of
#: its partner camera, or None.
LossOf = Callable[[int, object, object], torch.Tensor]
#: Per batch slot, the camera rendered with it for its loss, or None.
Partners = Optional[Sequence[Optional[Camera]]]
#: ``before_backward(seen)``: called with each camera's visibility before
#: the backward that reaches it (the strategy's ``step_pre_backward``).
BeforeBackward = Callable[[Visibility], None]


def camera_of(frame, background: torch.Tensor, device) -> Camera:
    """``frame``'s camera on ``device`` over ``background`` [3]."""
    return Camera(
        frame.viewmat.to(device), frame.K.to(device), int(frame.width), int(frame.height), background.to(device)
    )


class PerCameraRendering:
    """Camera by camera (module doc); ``render_cfg``: the config's ``render`` section."""

    def __init__(self, render_cfg: Dict, device):
        self.render_cfg, self.device = render_cfg, device

    def render(self, model: GaussianModel, camera: Camera, sh_degree: int):
        """One camera's :class:`splat.outputs.RasterOutput` (with autograd)."""
        r = self.render_cfg
        return render_frame(
            model,
            camera,
            camera.background,
            sh_degree=sh_degree,
            backend=r["backend"],
            near=r["near"],
            far=r["far"],
            device=self.device,
        )

    def backward(
        self,
        model: GaussianModel,
        cameras: Sequence[Camera],
        sh_degree: int,
        loss_of: LossOf,
        before_backward: BeforeBackward,
        partners: Partners = None,
    ) -> tuple[list[Visibility], float]:
        """Renders each camera (and its partner), backward of its loss / B
        before the next one renders.  Returns (the cameras' visibilities,
        bytes exchanged: 0)."""
        batch = len(cameras)
        seen = []
        for b, camera in enumerate(cameras):
            out = self.render(model, camera, sh_degree)
            partner = partners[b] if partners is not None else None
            partner_out = self.render(model, partner, sh_degree) if partner is not None else None
            loss = loss_of(b, out, partner_out)
            seen.append(visibility(out))
            before_backward(seen[-1])
            (loss / batch).backward()
        return seen, 0.0

    def render_views(self, model: GaussianModel, cameras: Sequence[Camera], sh_degree: int) -> dict:
        """{index in ``cameras``: output} of every camera (all render here)."""
        return {b: self.render(model, camera, sh_degree) for b, camera in enumerate(cameras)}


class ShardedRendering:
    """The batch together from every rank's shard (module doc)."""

    def __init__(self, render_cfg: Dict, group: Group):
        self.render_cfg, self.group = render_cfg, group

    def backward(
        self,
        model: GaussianModel,
        cameras: Sequence[Camera],
        sh_degree: int,
        loss_of: LossOf,
        before_backward: BeforeBackward,
        partners: Partners = None,
    ) -> tuple[list[Visibility], float]:
        """Renders the batch (and the partners, after it, in one call), one
        backward of the mean of this rank's cameras' losses (joined to the
        exchange by its anchor, so every rank runs the exchange's backward).
        Returns (every camera's visibility of this rank's surfels, bytes this
        rank sent both ways).  Camera i renders on rank i mod N and its
        partner on the same rank, so the camera's loss finds both renders
        there (every rank holds every training image, so the partner's photo
        is there too)."""
        batch = len(cameras)
        extra = [(b, p) for b, p in enumerate(partners or ()) if p is not None]
        everything = list(cameras) + [p for _, p in extra]
        world = self.group.world_size
        owners = [camera_rank(b, world) for b in range(batch)] + [camera_rank(b, world) for b, _ in extra]
        r = render_model(
            model, everything, self.group, sh_degree, self.render_cfg["near"], self.render_cfg["far"], owners
        )
        partner_slot = {b: batch + k for k, (b, _) in enumerate(extra)}
        loss_sum = r.anchor
        for b, out in r.outputs.items():
            if b >= batch:
                continue
            partner_out = r.outputs[partner_slot[b]] if b in partner_slot else None
            loss_sum = loss_sum + loss_of(b, out, partner_out) / batch
        seen = [Visibility(r.means2d[b], r.radii[b], c.width, c.height) for b, c in enumerate(cameras)]
        for camera in seen:
            before_backward(camera)
        loss_sum.backward()
        return seen, float(r.bytes_sent + r.bytes_backward)

    def render_views(self, model: GaussianModel, cameras: Sequence[Camera], sh_degree: int) -> dict:
        """{index in ``cameras``: output} of the cameras this rank renders. Collective."""
        return render_model(
            model, cameras, self.group, sh_degree, self.render_cfg["near"], self.render_cfg["far"]
        ).outputs


def make_batch_rendering(primitive: str, render_cfg: Dict, device, group: Group):
    """The implementation :func:`splat.training.capability.renders_sharded` picks."""
    if renders_sharded(primitive, render_cfg["backend"]):
        return ShardedRendering(render_cfg, group)
    return PerCameraRendering(render_cfg, device)
