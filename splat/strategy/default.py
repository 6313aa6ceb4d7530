"""The 3DGS / 2DGS adaptive density control, in gsplat's formulation.

Every step (until ``refine_stop``) it accumulates, for each surfel visible in
each of the step's views (``train.batch_size``), the norm of the screen-space
positional gradient ``out.means2d.grad`` scaled by ``[W/2, H/2]`` (so the
threshold is in normalised-device units and independent of resolution, like
gsplat and the original 3DGS), and the largest screen radius it had (as a
fraction of ``max(W, H)``).

Every ``refine_every`` steps in ``[refine_start, refine_stop)``:

* grow: surfels whose mean gradient exceeds ``grow_grad2d`` are
    - cloned if small (max scale <= ``grow_scale3d * scene_radius``): an exact
      copy is appended, and both then move apart under the next gradients;
    - split if large (or if larger than ``grow_scale2d`` of the screen, before
      ``refine_scale2d_stop``): replaced by 2 surfels sampled from the surfel's
      own 2D Gaussian *in its tangent plane* (a 3D Gaussian: from its 3D
      Gaussian, as 3DGS does), with scales divided by 1.6;
* prune: opacity < ``prune_opa``; and after the first opacity reset also
  too big in world (> ``prune_scale3d * scene_radius``) or, before
  ``refine_scale2d_stop``, on screen (> ``prune_scale2d``).
* Every ``reset_every`` steps opacities are clamped to ``2 * prune_opa`` (and
  their Adam moments zeroed) so that useless surfels fade and get pruned.

``max_gaussians`` caps growth (CPU memory/time): when the cap would be exceeded
only the surfels with the largest gradients grow.

Optimiser state: cloned rows copy their parent's Adam moments (gsplat); split
rows start with zero moments; pruned rows are dropped.  Every row edit goes
through the run's :class:`splat.state.PrimitiveState`, where the statistics
(``grad2d``, ``count``, ``radii``) are registered.

The thresholds come from :class:`splat.config.StrategyConfig` (the config's
``strategy`` section), the only place their defaults are declared.

Across processes (``group``), every decision is one the sharding
cannot change: each surfel's statistics are its own (its owner accumulates
the gradients that come back from every camera's rank), the split samples
are keyed by (``seed``, step, surfel id, child) (:mod:`splat.keyed_random`),
the cap picks the largest gradients over all ranks, ties broken by id, and
new surfels take ids by their parents' places among all ranks' parents.
One process runs the same code without communication, and keeps its rows in
increasing id order: clones are appended in their parents' order, then each
split's first children, then its second ones, with increasing ids.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..config import StrategyConfig
from ..distributed.collectives import all_counts, all_sum, gather_all
from ..distributed.group import Group
from ..keyed_random import SPLIT_STREAM, keyed_normal
from ..model import logit, quat_to_rotmat
from ..state import PrimitiveState
from .base import Strategy, Visibility, visibility


class DefaultStrategy(Strategy):
    """Clone / split / prune / reset (see the module doc) with the thresholds
    of ``cfg`` (default: the declared defaults), sizes relative to
    ``scene_radius``; ``seed`` keys the split samples, ``group`` (default:
    one process) is the set of processes densifying together."""

    #: The per-row statistics it registers in the table: accumulated
    #: normalised gradient norms [N], number of views each primitive was
    #: visible in [N], largest screen radius / max(W, H) [N].
    STATS = ("grad2d", "count", "radii")

    def __init__(
        self, cfg: Optional[StrategyConfig] = None, scene_radius: float = 1.0, seed: int = 0, group: Group | None = None
    ):
        self.cfg = cfg if cfg is not None else StrategyConfig()
        self.scene_radius = float(scene_radius)
        self.seed = int(seed)
        self.group = group if group is not None else Group()
        self.stats = {"cloned": 0, "split": 0, "pruned": 0}

    # --------------------------------------------------------------- state
    def bind(self, state: PrimitiveState) -> None:
        super().bind(state)
        for name in self.STATS:
            state.register(name)

    @property
    def grad2d(self) -> Optional[torch.Tensor]:  # [N]
        return self.state.stat("grad2d")

    @property
    def count(self) -> Optional[torch.Tensor]:  # [N]
        return self.state.stat("count")

    @property
    def radii(self) -> Optional[torch.Tensor]:  # [N]
        return self.state.stat("radii")

    def state_dict(self) -> dict:
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        self.stats = dict(state.get("stats", self.stats))

    def _reset_stats(self, n: int, device=None) -> None:
        for name in self.STATS:
            self.state.set_stat(name, torch.zeros(n, device=device))

    # ---------------------------------------------------------------- hooks
    def step_post_backward(self, model, optimizers: Dict, out, step: int) -> None:
        if step >= self.cfg.refine_stop:
            return
        self.table(model, optimizers)
        outs = [out] if isinstance(out, Visibility) or not isinstance(out, (list, tuple)) else out
        for camera in outs:
            # The step's loss is the mean over its cameras, so each camera's
            # means2d gradient is 1/len(outs) of its own loss's; undone here
            # so that grow_grad2d means the same for any batch size (gsplat).
            self._accumulate(model, camera, scale=float(len(outs)))
        cfg = self.cfg
        resets = cfg.reset_every > 0  # reset_every <= 0: never reset opacities
        if (
            step >= cfg.refine_start
            and step % cfg.refine_every == 0
            and (not resets or step % cfg.reset_every >= cfg.pause_refine_after_reset)
        ):
            self._refine(model, optimizers, step)
        if resets and step > 0 and step % cfg.reset_every == 0:
            self._reset_opacity(model, optimizers)

    @torch.no_grad()
    def _accumulate(self, model, out, scale: float = 1.0) -> None:
        state = self.table(model, None if self.state is None else self.state.optimizers)
        n = state.num_rows
        dev = state.device
        if self.grad2d is None:  # unset or stale
            self._reset_stats(n, dev)
        elif self.grad2d.device != dev:  # e.g. statistics loaded on another device
            for name in self.STATS:
                state.set_stat(name, state.stat(name).to(dev))
        out = visibility(out)
        g = out.means2d.grad
        if g is None:
            return
        H, W = out.height, out.width
        g = g.detach().float() * torch.tensor([W / 2.0 * scale, H / 2.0 * scale], device=g.device)  # [N, 2] NDC units
        radii = out.radii.detach()  # [N]
        vis = radii > 0
        self.grad2d[vis] += g[vis].norm(dim=-1)
        self.count[vis] += 1
        self.radii[vis] = torch.maximum(self.radii[vis], radii[vis].float() / float(max(W, H)))

    @torch.no_grad()
    def _refine(self, model, optimizers: Dict, step: int) -> None:
        state = self.table(model, optimizers)
        n_before = sum(all_counts(state.num_rows, self.group))
        n_clone, n_split = self._grow(state, step)
        n_prune = self._prune(state, step)
        self.stats["cloned"] += n_clone
        self.stats["split"] += n_split
        self.stats["pruned"] += n_prune
        if self.cfg.verbose and self.group.is_main:
            print(
                f"step {step}: {n_before} -> {n_before + n_clone + n_split - n_prune} surfels "
                f"(+{n_clone} cloned, +{n_split} split, -{n_prune} pruned)"
            )
        self._reset_stats(state.num_rows, state.device)

    @torch.no_grad()
    def _grow(self, state: PrimitiveState, step: int):
        cfg, model = self.cfg, state.model
        count = self.count.clamp_min(1)
        grads = self.grad2d / count  # [N]
        high = grads > cfg.grow_grad2d
        max_scale = model.scales.detach().max(dim=-1).values  # [N]
        small = max_scale <= cfg.grow_scale3d * self.scene_radius
        clone = high & small
        split = high & ~small
        if step < cfg.refine_scale2d_stop:
            split |= self.radii > cfg.grow_scale2d
        if cfg.max_gaussians > 0:
            clone, split = self._cap(state, grads, clone, split)
        ids = state.ids.to(clone.device)
        # New ids: after every id so far, in the order of their parents' ids
        # over all ranks (so one process keeps its rows in id order).
        (clone_ids,), n_clone = self._new_ids(state, ids[clone], 1)
        split_ids, n_split = self._new_ids(state, ids[split], 2)
        if clone_ids.numel():
            self._duplicate(state, clone, clone_ids)
        if split_ids[0].numel():
            # Clones were appended at the end, so the split mask just grows with False.
            split = torch.cat([split, torch.zeros(len(clone_ids), dtype=torch.bool, device=split.device)])
            self._split(state, split, split_ids, step)
        return n_clone, n_split

    def _new_ids(self, state: PrimitiveState, parents: torch.Tensor, children: int):
        """Ids for ``children`` new primitives per parent (ids ``parents`` [P]
        of this rank): returns ([children] tensors [P] of ids, the number of
        parents over all ranks), and reserves them in the table.  Child k of
        the parent at place j among all ranks' parents (sorted by id) gets
        ``next_id + k * total + j``."""
        everyone = torch.sort(gather_all(parents.cpu(), self.group)).values  # [total]
        place = torch.searchsorted(everyone, parents.cpu())
        total = everyone.numel()
        first = state.reserve_ids(children * total)
        return [first + k * total + place for k in range(children)], total

    def _cap(self, state: PrimitiveState, grads: torch.Tensor, clone: torch.Tensor, split: torch.Tensor):
        """Keep only the highest-gradient candidates, over all ranks, so that
        N stays <= max_gaussians; equal gradients go to the smaller id.

        A clone adds one primitive and a split adds one net (2 replace 1)."""
        n = sum(all_counts(state.num_rows, self.group))
        room = max(self.cfg.max_gaussians - n, 0)
        cand = clone | split
        ids = state.ids.to(cand.device)
        cand_ids, cand_grads = ids[cand].cpu(), grads[cand].double().cpu()
        all_ids, all_grads = gather_all(cand_ids, self.group), gather_all(cand_grads, self.group)
        if all_ids.numel() <= room:
            return clone, split
        # Largest gradient first, then smallest id: a total order, whatever the partition.
        order = torch.argsort(all_ids, stable=True)
        order = order[torch.argsort(-all_grads[order], stable=True)]
        chosen = all_ids[order[:room]]
        keep = torch.zeros_like(cand)
        keep[cand] = torch.isin(cand_ids, chosen).to(cand.device)
        return clone & keep, split & keep

    @torch.no_grad()
    def _duplicate(self, state: PrimitiveState, mask: torch.Tensor, new_ids: torch.Tensor) -> None:
        """Append exact copies of the masked rows (Adam moments and statistics
        included), ids ``new_ids``."""
        copies = state.take(mask.nonzero(as_tuple=True)[0])
        copies["ids"] = new_ids.cpu()
        state.append(copies)

    @torch.no_grad()
    def _split(self, state: PrimitiveState, mask: torch.Tensor, new_ids, step: int) -> None:
        """Replace each masked primitive by 2 samples of itself, scales / 1.6;
        children get ids ``new_ids`` ([2] tensors [S]), zero Adam moments and
        their parent's statistics, and are appended after the other rows."""
        model = state.model
        sel = mask.nonzero(as_tuple=True)[0]
        rest = (~mask).nonzero(as_tuple=True)[0]
        scales = model.scales.detach()[sel]  # [S, 2] surfels, [S, 3] 3D Gaussians
        R = quat_to_rotmat(model.params["quats"].detach()[sel])  # [S, 3, 3]
        # Sample in the tangent plane: zero std along the normal axis (2DGS).
        # A surfel's samples stay in its tangent plane (no spread along the normal).
        std = scales if scales.shape[1] == 3 else torch.cat([scales, torch.zeros_like(scales[:, :1])], dim=-1)
        # Keyed by (step, parent id): the same children on any number of processes.
        parent_ids = state.ids[sel.cpu()]
        keys = torch.stack([torch.full_like(parent_ids, int(step)), parent_ids], dim=1)  # [S, 2]
        noise = keyed_normal(self.seed, SPLIT_STREAM, keys, 6).reshape(len(sel), 2, 3).transpose(0, 1)
        local = noise.to(std.dtype).to(std.device) * std[None]  # [2, S, 3]
        offsets = torch.einsum("sij,bsj->bsi", R, local)  # [2, S, 3]
        new_means = (model.params["means"].detach()[sel][None] + offsets).reshape(-1, 3)
        new_log_scales = torch.log(scales / 1.6).repeat(2, 1)  # [2S, 2 or 3]

        children = {"ids": torch.cat([new_ids[0].cpu(), new_ids[1].cpu()])}
        for key, v in state.take(sel).items():
            if key == "param/means":
                children[key] = new_means
            elif key == "param/scales":
                children[key] = new_log_scales
            elif key.startswith("moment/"):
                children[key] = v.new_zeros((2 * len(sel),) + v.shape[1:])
            elif key != "ids":
                children[key] = v.repeat(2, *([1] * (v.dim() - 1)))
        state.keep(rest)
        state.append(children)

    @torch.no_grad()
    def _prune(self, state: PrimitiveState, step: int) -> int:
        cfg, model = self.cfg, state.model
        prune = model.opacities.detach() < cfg.prune_opa  # [N]
        if cfg.reset_every > 0 and step > cfg.reset_every:  # after the first opacity reset
            too_big = model.scales.detach().max(dim=-1).values > cfg.prune_scale3d * self.scene_radius
            if step < cfg.refine_scale2d_stop:
                too_big |= self.radii > cfg.prune_scale2d
            prune |= too_big
        n = int(prune.sum())
        total = int(all_sum([n], self.group)[0])
        if n:
            state.keep((~prune).nonzero(as_tuple=True)[0])
        return total

    @torch.no_grad()
    def _reset_opacity(self, model, optimizers: Dict) -> None:
        """Clamp opacities to 2 * prune_opa and zero the opacity Adam moments."""
        state = self.table(model, optimizers)
        cap = float(logit(torch.tensor(2.0 * self.cfg.prune_opa)))
        rows = {"param/opacities": state.model.params["opacities"].detach().clamp_max(cap)}
        rows.update({f"moment/opacities/{k}": torch.zeros_like(v) for k, v in state.moments("opacities").items()})
        state.set_rows(rows)
