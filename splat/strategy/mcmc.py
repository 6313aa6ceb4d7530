"""3DGS as Markov chain Monte Carlo (Kheradmand et al. 2024), as gsplat's
``MCMCStrategy`` does it: a budget of primitives, no clone / split / prune.

Every ``refine_every`` steps with ``refine_start < step < mcmc_refine_stop``:

* relocate: primitives of opacity <= ``mcmc_min_opacity`` ("dead") move onto
  live ones drawn in proportion to opacity, with replacement; a live one
  drawn ``m`` times and its ``m`` copies each get the opacity and scales of
  one of ``m + 1`` copies that render as it did
  (:func:`splat.strategy.relocation.relocated_opacity_scale`);
* grow: ``min(max_gaussians, int(1.05 N)) - N`` new copies of primitives
  drawn the same way from all of them, corrected the same way.

After every optimiser step the means get the gated noise of
:func:`splat.strategy.relocation.position_noise`, scaled by the step's means
learning rate x ``mcmc_noise_lr``; the loss gets ``mcmc_opacity_reg`` x the
mean opacity + ``mcmc_scale_reg`` x the mean scale (:meth:`MCMCStrategy.loss`).

Both are gsplat's formulas in a scene of radius 1, which is what gsplat's
trainer trains in (it normalises the world before training), so that the
same settings move a scene of any unit alike.  gsplat's noise
``Sigma z gate lr noise_lr`` with Sigma in length^2 and the means' rate lr in
length grows with the cube of the unit: in a scene of radius R (world units)
it is taken in radii, ``(Sigma / R^2) z gate (lr / R) noise_lr``, and moved
back, x R: ``Sigma z gate lr noise_lr / R^2``.  Taken as it is in world units
instead, still_life (R = 3.6) got 13 x the noise and a default.yaml run
collapsed (bench/results/mcmc_still_life_default_trace.json).  The scale
regulariser is likewise on scales in radii.

Optimiser state: the moments of relocated rows, dead and drawn, are zeroed
(gsplat zeroes the drawn ones and leaves the dead rows the moments of the
primitive that was there; a copy has no such history); new rows start at
zero and their sources keep theirs (gsplat).

Across processes every draw is keyed by (seed, step, kind, draw) over all
ranks' (id, opacity) in id order, the noise by (seed, step, id), and a dead
row takes its source's corrected row from whichever rank owns it, so one
process and N make the same moves.  A relocated row keeps its id; new rows
take ids ``next_id + draw`` and live on their source's rank, so one process
keeps its rows in increasing id order.  The strategy registers no per-row
statistics: a resumed run replays the same moves from the parameters alone.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..config import StrategyConfig
from ..distributed.collectives import all_counts, gather_all
from ..distributed.group import Group
from ..keyed_random import MCMC_NOISE_STREAM, MCMC_SAMPLE_STREAM
from ..state import PrimitiveState
from .base import Strategy
from .relocation import keyed_draw, position_noise, relocated_opacity_scale

#: Kinds of draw, part of their keys.
_RELOCATE, _GROW = 0, 1


class MCMCStrategy(Strategy):
    """Relocation, growth to ``cfg.max_gaussians`` and position noise (see the
    module doc); ``seed`` keys every draw, ``group`` (default: one process) is
    the set of processes whose primitives it moves together."""

    def __init__(
        self, cfg: Optional[StrategyConfig] = None, scene_radius: float = 1.0, seed: int = 0, group: Group | None = None
    ):
        self.cfg = cfg if cfg is not None else StrategyConfig(name="mcmc", max_gaussians=1_000_000)
        if self.cfg.max_gaussians <= 0:
            raise ValueError(
                "strategy.name=mcmc needs strategy.max_gaussians > 0 (the number of primitives it grows to)"
            )
        self.scene_radius = float(scene_radius)
        self.seed = int(seed)
        self.group = group if group is not None else Group()
        self.stats = {"relocated": 0, "added": 0}

    def state_dict(self) -> dict:
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        self.stats = dict(state.get("stats", self.stats))

    # ---------------------------------------------------------------- hooks
    def loss(self, model) -> Optional[torch.Tensor]:
        """``mcmc_opacity_reg`` x mean opacity + ``mcmc_scale_reg`` x mean scale
        in scene radii over every rank's primitives (gsplat's L1 terms: both are positive).
        This rank's share: its sums over the global count, so each row's
        gradient is the same on any number of processes.  Collective."""
        cfg = self.cfg
        n = sum(all_counts(model.num_gaussians, self.group))
        if n == 0 or (cfg.mcmc_opacity_reg <= 0 and cfg.mcmc_scale_reg <= 0):
            return None
        total = model.means.new_zeros(())
        if cfg.mcmc_opacity_reg > 0:
            total = total + cfg.mcmc_opacity_reg * model.opacities.sum() / n
        if cfg.mcmc_scale_reg > 0:
            scales = model.scales  # [N, D] world units; the regulariser is on radii (module doc)
            total = total + cfg.mcmc_scale_reg * scales.sum() / (n * scales.shape[1] * self.scene_radius)
        return total

    def step_post_backward(self, model, optimizers: Dict, out, step: int) -> None:
        state = self.table(model, optimizers)
        cfg = self.cfg
        if cfg.refine_start < step < cfg.mcmc_refine_stop and step % cfg.refine_every == 0:
            n_before = sum(all_counts(state.num_rows, self.group))
            relocated = self._relocate(state, step)
            added = self._grow(state, step)
            self.stats["relocated"] += relocated
            self.stats["added"] += added
            if cfg.verbose and self.group.is_main:
                print(f"step {step}: {n_before} -> {n_before + added} primitives ({relocated} relocated)")
        lr = float(optimizers["means"].param_groups[0]["lr"])
        # lr is the means' rate in world units (x R): gsplat's noise in radii, back in world units (module doc)
        self._add_noise(state, step, lr * cfg.mcmc_noise_lr / self.scene_radius**2)

    # ---------------------------------------------------------------- moves
    def _everyone(self, state: PrimitiveState):
        """(ids [M], opacities [M] float64) of every rank's primitives, in id order."""
        ids = gather_all(state.ids.cpu(), self.group)
        opacities = gather_all(state.model.opacities.detach().double().cpu(), self.group)
        order = torch.argsort(ids)
        return ids[order], opacities[order]

    @torch.no_grad()
    def _relocate(self, state: PrimitiveState, step: int) -> int:
        """Dead rows take corrected copies of drawn live ones; returns how many moved (all ranks)."""
        ids, opacities = self._everyone(state)
        dead = opacities <= self.cfg.mcmc_min_opacity
        n_dead = int(dead.sum())
        if n_dead == 0 or n_dead == len(ids):
            return 0
        alive = ~dead
        draws = keyed_draw(opacities[alive], n_dead, self.seed, MCMC_SAMPLE_STREAM, (step, _RELOCATE))
        sources = ids[alive][draws]  # [n_dead]: the source of the j-th dead id
        params, src_rows = self._shared(state, sources)
        # Every rank's corrected sources, by id: a dead row's source may live elsewhere.
        got_ids = gather_all(state.ids[src_rows], self.group)
        order = torch.argsort(got_ids)
        dead_rows = torch.isin(state.ids, ids[dead]).nonzero(as_tuple=True)[0]  # [D_local]
        wanted = sources[torch.searchsorted(ids[dead], state.ids[dead_rows])]
        pick = order[torch.searchsorted(got_ids[order], wanted)]
        dev = state.device
        for p in params.values():
            got = gather_all(p[src_rows.to(dev)].cpu(), self.group)
            p[dead_rows.to(dev)] = got[pick].to(dev)
        touched = torch.cat([src_rows, dead_rows]).to(dev)
        rows = {f"param/{name}": p for name, p in params.items()}
        for name in params:
            for key, v in state.moments(name).items():
                v = v.clone()
                v[touched] = 0
                rows[f"moment/{name}/{key}"] = v
        state.set_rows(rows)
        return n_dead

    @torch.no_grad()
    def _grow(self, state: PrimitiveState, step: int) -> int:
        """Appends ``min(max_gaussians, int(1.05 N)) - N`` corrected copies; returns that count."""
        n = sum(all_counts(state.num_rows, self.group))
        add = min(self.cfg.max_gaussians, int(1.05 * n)) - n
        if add <= 0:
            return 0
        ids, opacities = self._everyone(state)
        sources = ids[keyed_draw(opacities, add, self.seed, MCMC_SAMPLE_STREAM, (step, _GROW))]  # [add]
        params, _ = self._shared(state, sources)
        first = state.reserve_ids(add)
        mine = torch.isin(sources, state.ids).nonzero(as_tuple=True)[0]  # this rank's draws, in draw order
        order = torch.argsort(state.ids)
        pos = order[torch.searchsorted(state.ids[order], sources[mine])].to(state.device)
        state.set_rows({f"param/{name}": p for name, p in params.items()})  # sources keep their moments
        children = {f"param/{name}": p[pos] for name, p in params.items()}
        children["ids"] = first + mine  # zero moments: no optimiser history
        state.append(children)
        return add

    def _shared(self, state: PrimitiveState, sources: torch.Tensor):
        """Copies of the parameters with this rank's rows among ``sources``
        (ids, repeated as drawn) set to one share of ``times drawn + 1``
        copies; returns (params by name, those rows [S] on the CPU)."""
        model = state.model
        uniq, counts = torch.unique(sources, return_counts=True)  # sorted
        rows = torch.isin(state.ids, uniq).nonzero(as_tuple=True)[0]  # [S]
        copies = counts[torch.searchsorted(uniq, state.ids[rows])] + 1
        dev = state.device
        r = rows.to(dev)
        o, s = relocated_opacity_scale(model.opacities.detach()[r], model.scales.detach()[r], copies.to(dev))
        eps = torch.finfo(model.means.dtype).eps
        o = o.clamp(self.cfg.mcmc_min_opacity, 1.0 - eps)
        params = {name: p.detach().clone() for name, p in model.params.items()}
        params["opacities"][r] = (torch.log(o) - torch.log1p(-o)).to(params["opacities"].dtype)
        params["scales"][r] = torch.log(s).to(params["scales"].dtype)
        return params, rows

    @torch.no_grad()
    def _add_noise(self, state: PrimitiveState, step: int, scaler: float) -> None:
        model = state.model
        if state.num_rows == 0 or scaler == 0:
            return
        noise = position_noise(
            model.params["quats"],
            model.scales,
            model.opacities,
            state.ids,
            step,
            scaler,
            self.seed,
            MCMC_NOISE_STREAM,
        )
        model.params["means"].add_(noise.to(model.means.dtype))
