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
rows start with zero moments; pruned rows are dropped.

Across processes (issue 23; ``group``), every decision is one the sharding
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

from typing import Dict

import torch

from ..distributed.group import Group
from ..distributed.shard import all_counts, all_sum, gather_all
from ..keyed_random import SPLIT_STREAM, keyed_normal
from ..model import logit, quat_to_rotmat
from . import Strategy, Visibility, update_params, visibility


class DefaultStrategy(Strategy):
    def __init__(
        self,
        scene_radius: float = 1.0,
        prune_opa: float = 0.005,
        grow_grad2d: float = 0.0002,
        grow_scale3d: float = 0.01,
        grow_scale2d: float = 0.05,
        prune_scale3d: float = 0.1,
        prune_scale2d: float = 0.15,
        refine_scale2d_stop: int = 0,
        refine_start: int = 500,
        refine_stop: int = 15000,
        refine_every: int = 100,
        reset_every: int = 3000,
        pause_refine_after_reset: int = 0,
        max_gaussians: int = 0,
        verbose: bool = False,
        seed: int = 0,
        group: Group | None = None,
    ):
        self.scene_radius = float(scene_radius)
        self.prune_opa = prune_opa
        self.grow_grad2d = grow_grad2d
        self.grow_scale3d = grow_scale3d
        self.grow_scale2d = grow_scale2d
        self.prune_scale3d = prune_scale3d
        self.prune_scale2d = prune_scale2d
        self.refine_scale2d_stop = refine_scale2d_stop
        self.refine_start = refine_start
        self.refine_stop = refine_stop
        self.refine_every = refine_every
        self.reset_every = reset_every
        self.pause_refine_after_reset = pause_refine_after_reset
        self.max_gaussians = int(max_gaussians)
        self.verbose = verbose
        self.seed = int(seed)
        self.group = group if group is not None else Group()
        self.grad2d = None  # [N] accumulated normalised gradient norms
        self.count = None  # [N] number of views each surfel was visible in
        self.radii = None  # [N] max screen radius / max(W, H)
        self.stats = {"cloned": 0, "split": 0, "pruned": 0}

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "grad2d": self.grad2d,
            "count": self.count,
            "radii": self.radii,
            "stats": dict(self.stats),
        }

    def load_state_dict(self, state: dict) -> None:
        self.grad2d = state.get("grad2d")
        self.count = state.get("count")
        self.radii = state.get("radii")
        self.stats = dict(state.get("stats", self.stats))

    #: The entries of :meth:`state_dict` with one row per surfel.
    ROW_KEYS = ("grad2d", "count", "radii")

    def row_state(self, n: int) -> Dict[str, torch.Tensor]:
        if self.grad2d is None or self.grad2d.shape[0] != n:
            return {}  # stale or absent: the next step starts them afresh
        return {k: getattr(self, k) for k in self.ROW_KEYS}

    def set_row_state(self, rows: Dict[str, torch.Tensor]) -> None:
        for k in self.ROW_KEYS:
            setattr(self, k, rows.get(k))

    def _reset_stats(self, n: int, device=None) -> None:
        self.grad2d = torch.zeros(n, device=device)
        self.count = torch.zeros(n, device=device)
        self.radii = torch.zeros(n, device=device)

    # ---------------------------------------------------------------- hooks
    def step_post_backward(self, model, optimizers: Dict, out, step: int) -> None:
        if step >= self.refine_stop:
            return
        outs = [out] if isinstance(out, Visibility) or not isinstance(out, (list, tuple)) else out
        for camera in outs:
            # The step's loss is the mean over its cameras, so each camera's
            # means2d gradient is 1/len(outs) of its own loss's; undone here
            # so that grow_grad2d means the same for any batch size (gsplat).
            self._accumulate(model, camera, scale=float(len(outs)))
        resets = self.reset_every > 0  # reset_every <= 0: never reset opacities
        if (
            step >= self.refine_start
            and step % self.refine_every == 0
            and (not resets or step % self.reset_every >= self.pause_refine_after_reset)
        ):
            self._refine(model, optimizers, step)
        if resets and step > 0 and step % self.reset_every == 0:
            self._reset_opacity(model, optimizers)

    @torch.no_grad()
    def _accumulate(self, model, out, scale: float = 1.0) -> None:
        n = model.num_gaussians
        dev = model.means.device
        if self.grad2d is None or self.grad2d.shape[0] != n:
            self._reset_stats(n, dev)
        elif self.grad2d.device != dev:  # e.g. stats loaded from a checkpoint on the CPU
            self._remap_stats(lambda v: v.to(dev))
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
        n_before = sum(all_counts(model.num_gaussians, self.group))
        n_clone, n_split = self._grow(model, optimizers, step)
        n_prune = self._prune(model, optimizers, step)
        self.stats["cloned"] += n_clone
        self.stats["split"] += n_split
        self.stats["pruned"] += n_prune
        if self.verbose and self.group.is_main:
            print(
                f"step {step}: {n_before} -> {n_before + n_clone + n_split - n_prune} surfels "
                f"(+{n_clone} cloned, +{n_split} split, -{n_prune} pruned)"
            )
        self._reset_stats(model.num_gaussians, model.means.device)

    @torch.no_grad()
    def _grow(self, model, optimizers: Dict, step: int):
        count = self.count.clamp_min(1)
        grads = self.grad2d / count  # [N]
        high = grads > self.grow_grad2d
        max_scale = model.scales.detach().max(dim=-1).values  # [N]
        small = max_scale <= self.grow_scale3d * self.scene_radius
        clone = high & small
        split = high & ~small
        if step < self.refine_scale2d_stop:
            split |= self.radii > self.grow_scale2d
        if self.max_gaussians > 0:
            clone, split = self._cap(model, grads, clone, split)
        ids = model.ids.to(clone.device)
        # New ids: after every id so far, in the order of their parents' ids
        # over all ranks (so one process keeps its rows in id order).
        (clone_ids,), n_clone = self._new_ids(model, ids[clone], 1)
        split_ids, n_split = self._new_ids(model, ids[split], 2)
        if clone_ids.numel():
            self._duplicate(model, optimizers, clone, clone_ids)
        if split_ids[0].numel():
            # Clones were appended at the end, so the split mask just grows with False.
            split = torch.cat([split, torch.zeros(len(clone_ids), dtype=torch.bool, device=split.device)])
            self._split(model, optimizers, split, split_ids, step)
        return n_clone, n_split

    def _new_ids(self, model, parents: torch.Tensor, children: int):
        """Ids for ``children`` new surfels per parent (ids ``parents`` [P] of
        this rank): returns ([children] tensors [P] of ids, the number of
        parents over all ranks), and advances ``model.next_id``.  Child k of the
        parent at place j among all ranks' parents (sorted by id) gets
        ``next_id + k * total + j``."""
        everyone = torch.sort(gather_all(parents.cpu(), self.group)).values  # [total]
        place = torch.searchsorted(everyone, parents.cpu())
        total = everyone.numel()
        new = [model.next_id + k * total + place for k in range(children)]
        model.next_id += children * total
        return new, total

    def _cap(self, model, grads: torch.Tensor, clone: torch.Tensor, split: torch.Tensor):
        """Keep only the highest-gradient candidates, over all ranks, so that
        N stays <= max_gaussians; equal gradients go to the smaller id.

        A clone adds one surfel and a split adds one net (2 replace 1)."""
        n = sum(all_counts(model.num_gaussians, self.group))
        room = max(self.max_gaussians - n, 0)
        cand = clone | split
        ids = model.ids.to(cand.device)
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

    def _remap_stats(self, fn) -> None:
        """Apply a row remapping (clone/split) to the per-surfel statistics."""
        self.grad2d, self.count, self.radii = fn(self.grad2d), fn(self.count), fn(self.radii)

    @torch.no_grad()
    def _duplicate(self, model, optimizers: Dict, mask: torch.Tensor, new_ids: torch.Tensor) -> None:
        """Append exact copies of the masked surfels (copying their Adam moments), ids ``new_ids``."""
        sel = mask.nonzero(as_tuple=True)[0]
        update_params(
            model, optimizers,
            lambda name, p: torch.cat([p, p[sel]]),
            lambda key, v: torch.cat([v, v[sel]]),
        )
        self._remap_stats(lambda v: torch.cat([v, v[sel]]))
        model.ids = torch.cat([model.ids, new_ids.cpu()])

    @torch.no_grad()
    def _split(self, model, optimizers: Dict, mask: torch.Tensor, new_ids, step: int) -> None:
        """Replace each masked surfel by 2 samples of itself, scales / 1.6;
        children get ids ``new_ids`` ([2] tensors [S])."""
        sel = mask.nonzero(as_tuple=True)[0]
        rest = (~mask).nonzero(as_tuple=True)[0]
        scales = model.scales.detach()[sel]  # [S, 2] surfels, [S, 3] 3D Gaussians
        R = quat_to_rotmat(model.params["quats"].detach()[sel])  # [S, 3, 3]
        # Sample in the tangent plane: zero std along the normal axis (2DGS).
        # A surfel's samples stay in its tangent plane (no spread along the normal).
        std = scales if scales.shape[1] == 3 else torch.cat([scales, torch.zeros_like(scales[:, :1])], dim=-1)
        # Keyed by (step, parent id): the same children on any number of processes.
        parent_ids = model.ids[sel.cpu()]
        keys = torch.stack([torch.full_like(parent_ids, int(step)), parent_ids], dim=1)  # [S, 2]
        noise = keyed_normal(self.seed, SPLIT_STREAM, keys, 6).reshape(len(sel), 2, 3).transpose(0, 1)
        local = noise.to(std.dtype).to(std.device) * std[None]  # [2, S, 3]
        offsets = torch.einsum("sij,bsj->bsi", R, local)  # [2, S, 3]
        new_means = (model.params["means"].detach()[sel][None] + offsets).reshape(-1, 3)
        new_log_scales = torch.log(scales / 1.6).repeat(2, 1)  # [2S, 2 or 3]

        def param_fn(name: str, p: torch.Tensor) -> torch.Tensor:
            if name == "means":
                child = new_means
            elif name == "scales":
                child = new_log_scales
            else:
                child = p[sel].repeat(2, *([1] * (p.dim() - 1)))
            return torch.cat([p[rest], child])

        def optim_fn(key: str, v: torch.Tensor) -> torch.Tensor:
            return torch.cat([v[rest], v.new_zeros((2 * len(sel),) + v.shape[1:])])

        update_params(model, optimizers, param_fn, optim_fn)
        self._remap_stats(lambda v: torch.cat([v[rest], v[sel].repeat(2)]))
        model.ids = torch.cat([model.ids[rest.cpu()], new_ids[0].cpu(), new_ids[1].cpu()])

    @torch.no_grad()
    def _prune(self, model, optimizers: Dict, step: int) -> int:
        prune = model.opacities.detach() < self.prune_opa  # [N]
        if self.reset_every > 0 and step > self.reset_every:  # after the first opacity reset
            too_big = model.scales.detach().max(dim=-1).values > self.prune_scale3d * self.scene_radius
            if step < self.refine_scale2d_stop:
                too_big |= self.radii > self.prune_scale2d
            prune |= too_big
        n = int(prune.sum())
        total = int(all_sum([n], self.group)[0])
        if n:
            keep = (~prune).nonzero(as_tuple=True)[0]
            update_params(model, optimizers, lambda name, p: p[keep], lambda key, v: v[keep])
            model.ids = model.ids[keep.cpu()]
        return total

    @torch.no_grad()
    def _reset_opacity(self, model, optimizers: Dict) -> None:
        """Clamp opacities to 2 * prune_opa and zero the opacity Adam moments."""
        cap = float(logit(torch.tensor(2.0 * self.prune_opa)))
        update_params(
            model, optimizers,
            lambda name, p: p.clamp_max(cap),
            lambda key, v: torch.zeros_like(v),
            names=["opacities"],
        )
