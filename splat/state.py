"""The table of per-primitive state: every tensor with one row per primitive.

Each primitive (a surfel or a 3D Gaussian) of a run owns one row of:

* the model's parameters, ``model.params[name]`` (``nn.Parameter`` [N, ...]);
* their optimiser moments: the tensors of each parameter's optimiser state
  with one row per primitive (Adam's ``exp_avg`` / ``exp_avg_sq``); scalar
  state (Adam's ``step``) is shared by all rows and never edited here;
* its id, ``model.ids`` [N] int64 on the CPU (unique in the run, never
  reused), and the run's next free id, ``model.next_id``;
* the per-row statistics a strategy registers by name
  (:meth:`PrimitiveState.register`, e.g. the default strategy's gradient
  accumulators).

:class:`PrimitiveState` is the one place that edits them, so they stay
aligned: strategies (:mod:`splat.strategy`), rebalancing across processes
(:mod:`splat.distributed.shard`) and checkpoints (:mod:`splat.checkpoints`)
all go through it.  Its row edits are :meth:`~PrimitiveState.keep`,
:meth:`~PrimitiveState.take`, :meth:`~PrimitiveState.append`,
:meth:`~PrimitiveState.rows` / :meth:`~PrimitiveState.set_rows`; on the
checkpoint form (:meth:`~PrimitiveState.state_dict`),
:meth:`~PrimitiveState.merge` (shards -> whole, by id) and
:meth:`~PrimitiveState.slice` (whole -> one rank's balanced slice).

Rows are named (``rows()``, ``take()``, ``set_rows()``, ``append()``)::

    "ids"                   [N] int64
    "param/<name>"          [N, ...]  e.g. "param/means" [N, 3]
    "moment/<name>/<key>"   [N, ...]  e.g. "moment/means/exp_avg" [N, 3]
    "stat/<name>"           [N, ...]  e.g. "stat/grad2d" [N]

A registered statistic whose row count is not N (never set, or left behind
by an edit made outside the table) is *stale*: :meth:`~PrimitiveState.stat`
returns None, and it is neither moved nor saved; its owner starts it afresh.

Every edit copies rows exactly (indexing, concatenation), so an edit made
through the table gives the same bits as the same edit made by hand.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from .distributed.shard import balanced_slice
from .errors import RunStateError

__all__ = ["PrimitiveState"]

Rows = Dict[str, torch.Tensor]
Index = Union[torch.Tensor, slice]


class PrimitiveState:
    """The per-primitive state of ``model`` (a :class:`splat.model.GaussianModel`)
    and its ``optimizers`` (``{param name: optimiser of that one parameter}``;
    entries of other names, e.g. ``"appearance"``, are not per-primitive and
    are ignored)."""

    def __init__(self, model, optimizers: Optional[Dict[str, torch.optim.Optimizer]] = None):
        self.model = model
        self.optimizers = optimizers if optimizers is not None else {}
        self._stats: Dict[str, Optional[torch.Tensor]] = {}

    # ------------------------------------------------------------ reading
    @property
    def num_rows(self) -> int:
        """N, the number of primitives (rows)."""
        return self.model.num_gaussians

    @property
    def ids(self) -> torch.Tensor:  # [N] int64, CPU
        return self.model.ids

    @property
    def next_id(self) -> int:
        return self.model.next_id

    @property
    def device(self) -> torch.device:
        return self.model.means.device

    def moments(self, name: str) -> Dict[str, torch.Tensor]:
        """Parameter ``name``'s per-row optimiser state ``{key: [N, ...]}``
        (empty before the optimiser's first step)."""
        opt = self.optimizers.get(name)
        if opt is None:
            return {}
        state = opt.state.get(self.model.params[name], {})
        return {k: v for k, v in state.items() if _is_row_moment(k, v)}

    def stat_names(self) -> List[str]:
        """The registered statistics, in registration order."""
        return list(self._stats)

    def stat(self, name: str) -> Optional[torch.Tensor]:
        """Statistic ``name`` [N, ...], or None when stale or unset."""
        v = self._stats.get(name)
        return v if v is not None and v.shape[0] == self.num_rows else None

    # ------------------------------------------------------- registration
    def register(self, name: str) -> None:
        """Declares the per-row statistic ``name``: from now on it moves with
        its rows in every edit, rebalance and checkpoint.  A value already
        there (loaded from a checkpoint) is kept."""
        self._stats.setdefault(name, None)

    def set_stat(self, name: str, value: Optional[torch.Tensor]) -> None:
        """Sets (registering if needed) statistic ``name`` to ``value`` [N, ...]
        (None: stale)."""
        if value is not None and value.shape[0] != self.num_rows:
            raise ValueError(f"statistic {name!r} has {value.shape[0]} rows, the model {self.num_rows}")
        self._stats[name] = value

    # ---------------------------------------------------------- row edits
    def rows(self) -> Rows:
        """Every per-primitive tensor, by row name (see the module doc), on
        the model's device; stale statistics are left out."""
        device = self.device
        out = {"ids": self.ids.to(device)}
        for name, p in self.model.params.items():
            out[f"param/{name}"] = p.detach()
            for key, v in self.moments(name).items():
                out[f"moment/{name}/{key}"] = v
        for name in self._stats:
            v = self.stat(name)
            if v is not None:
                out[f"stat/{name}"] = v.to(device)
        return out

    def take(self, index: Index) -> Rows:
        """The rows ``index`` (indices or a boolean mask [N]) of every
        per-primitive tensor, as :meth:`rows` names them (copies)."""
        return {k: v[_on(index, v.device)] for k, v in self.rows().items()}

    @torch.no_grad()
    def set_rows(self, rows: Rows) -> None:
        """Replaces the tensors named in ``rows`` (see the module doc); the
        others are kept.  Replacing a parameter makes a new ``nn.Parameter``
        and moves its optimiser state to it; its moments are those of
        ``rows`` or, where ``rows`` names none, the old ones."""
        self._drop_stale()
        for name in list(self.model.params.keys()):
            prefix = f"moment/{name}/"
            moments = {k[len(prefix) :]: v for k, v in rows.items() if k.startswith(prefix)}
            if f"param/{name}" in rows:
                self._replace(
                    name,
                    lambda p, name=name: rows[f"param/{name}"],
                    lambda key, v, moments=moments: moments.get(key, v),
                )
            elif moments:
                state = self.optimizers[name].state[self.model.params[name]]
                for key, v in moments.items():
                    state[key] = v.contiguous()
        if "ids" in rows:
            self.model.ids = rows["ids"].cpu()
        for key, v in rows.items():
            if key.startswith("stat/"):
                self._stats[key[len("stat/") :]] = v

    @torch.no_grad()
    def keep(self, index: Index) -> None:
        """Keeps only the rows ``index`` (indices or a boolean mask [N]), in
        that order, of every per-primitive tensor."""
        self._apply(lambda v: v[_on(index, v.device)])

    @torch.no_grad()
    def append(self, rows: Rows) -> None:
        """Appends new rows at the end: ``rows`` as :meth:`take` names them,
        each [M, ...].  ``rows["ids"]`` gives their ids (with several
        processes a strategy must choose them the same way on every rank);
        without it they get the next free ids (:meth:`reserve_ids`).  Every
        parameter needs its rows; missing moments and statistics start at
        zero (a new primitive has no optimiser history)."""
        added = rows[f"param/{next(iter(self.model.params))}"].shape[0]
        ids = rows.get("ids")
        if ids is None:
            first = self.reserve_ids(added)
            ids = torch.arange(first, first + added, dtype=torch.int64)

        def grown(key: str, v: torch.Tensor) -> torch.Tensor:
            new = rows.get(key)
            return torch.cat([v, new if new is not None else v.new_zeros((added,) + tuple(v.shape[1:]))])

        self._apply(
            None,
            param_fn=lambda name, p: grown(f"param/{name}", p),
            moment_fn=lambda name, key, v: grown(f"moment/{name}/{key}", v),
            stat_fn=lambda name, v: grown(f"stat/{name}", v),
        )
        self.model.ids = torch.cat([self.model.ids, ids.cpu()])

    def reserve_ids(self, count: int) -> int:
        """Reserves ``count`` new ids and returns the first: ``next_id`` ..
        ``next_id + count - 1``.  (With several processes every rank must
        reserve the same count, as :class:`splat.strategy.DefaultStrategy`
        does.)"""
        first = self.model.next_id
        self.model.next_id = first + int(count)
        return first

    @torch.no_grad()
    def edit_params(
        self,
        param_fn: Callable[[str, torch.Tensor], torch.Tensor],
        moment_fn: Callable[[str, torch.Tensor], torch.Tensor],
        names=None,
    ) -> None:
        """Replaces parameters ``names`` (default: all) by ``param_fn(name, p)``
        and their moments by ``moment_fn(key, v)``, leaving ids and statistics
        as they are: for edits that keep the rows (e.g. clamping values).  An
        edit that changes the row count this way leaves the ids and statistics
        stale (see :meth:`check_ids`)."""
        for name in list(self.model.params.keys()) if names is None else names:
            self._replace(name, lambda p, name=name: param_fn(name, p), moment_fn)

    def check_ids(self, distributed: bool) -> None:
        """Ids left stale by an edit made without them (one that changed the
        row count through :meth:`edit_params` or
        :func:`splat.strategy.update_params`): one process numbers its rows
        afresh (their order is all a render needs there); several processes
        cannot, and stop with a RunStateError."""
        n = self.num_rows
        if len(self.model.ids) == n:
            return
        if distributed:
            raise RunStateError(
                "the strategy changed the number of surfels without their ids (model.ids), which "
                "several processes need: edit rows through splat.state.PrimitiveState"
            )
        self.model.ids = torch.arange(n)
        self.model.next_id = n

    # ---------------------------------------------------- checkpoint form
    def state_dict(self) -> dict:
        """The table's part of a checkpoint (on the CPU): ``params``,
        ``ids``, ``next_id``, ``row_stats`` (fresh statistics).  The moments
        are saved with their optimisers' own state dicts
        (``checkpoint["optimizers"][name]["state"][0]``), where
        :meth:`merge` and :meth:`slice` find them."""
        return {
            "params": {k: v.cpu() for k, v in self.model.raw_state().items()},
            "ids": self.model.ids.clone(),
            "next_id": self.model.next_id,
            "row_stats": {k: v for k in self._stats if (v := self.stat(k)) is not None},
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restores parameter values (copied into the model's, same shapes),
        ids, ``next_id`` and every statistic of ``state`` (a
        :meth:`state_dict` or a checkpoint).  The moments come with the
        optimisers' ``load_state_dict``."""
        for name, p in self.model.params.items():
            v = state["params"][name]
            if v.shape != p.shape:
                raise ValueError(f"params.{name} has shape {tuple(v.shape)}, the model {tuple(p.shape)}")
            p.copy_(v)
        if state.get("ids") is not None:
            self.model.ids = state["ids"].to(torch.int64).cpu()
        if state.get("next_id") is not None:
            self.model.next_id = int(state["next_id"])
        stats = state.get("row_stats")
        if stats is None:  # written before row_stats: the registered ones sat in the strategy's state
            stats = {k: v for k, v in (state.get("strategy") or {}).items() if k in self._stats and torch.is_tensor(v)}
        for name, v in stats.items():
            self._stats[name] = None if v is None else v.to(self.device)

    @staticmethod
    def merge(shards: List[dict]) -> dict:
        """One checkpoint of the whole model from a run's shards (checkpoints
        in rank order): per-primitive tensors concatenated, then sorted by
        id; ``next_id`` the largest; the rest is rank 0's."""
        whole = _copy_without_rows(shards[0])
        entries = _row_entries(whole)
        for get, put in entries:
            put(whole, torch.cat([get(s) for s in shards]))
        if len(entries) != len(_row_entries(whole)):
            raise ValueError("shards disagree on their optimiser state or statistics")
        order = torch.argsort(_ids(whole))
        for get, put in _row_entries(whole):
            put(whole, get(whole)[order])
        whole["next_id"] = max(int(s.get("next_id", len(_ids(s)))) for s in shards)
        return whole

    @staticmethod
    def slice(whole: dict, world_size: int, rank: int) -> dict:
        """Rank ``rank``'s balanced slice (:func:`splat.distributed.shard.balanced_slice`)
        of the checkpoint ``whole`` (rows in id order, as :meth:`merge` gives)."""
        start, stop = balanced_slice(len(_ids(whole)), world_size, rank)
        part = _copy_without_rows(whole)
        for get, put in _row_entries(part):
            put(part, get(part)[start:stop].clone())
        return part

    # ---------------------------------------------------------- internals
    def _replace(
        self,
        name: str,
        param_fn: Callable[[torch.Tensor], torch.Tensor],
        moment_fn: Callable[[str, torch.Tensor], torch.Tensor],
    ) -> None:
        """Parameter ``name`` becomes a new ``nn.Parameter`` ``param_fn(p)``;
        its optimiser's per-row state ``v`` becomes ``moment_fn(key, v)``
        and follows it (scalar state unchanged)."""
        old = self.model.params[name]
        new = nn.Parameter(param_fn(old.data).contiguous(), requires_grad=old.requires_grad)
        opt = self.optimizers.get(name)
        if opt is not None:
            group = opt.param_groups[0]
            assert len(group["params"]) == 1 and group["params"][0] is old, name
            state = opt.state.pop(old, None)
            if state is not None:
                for key, v in list(state.items()):
                    if _is_row_moment(key, v):
                        state[key] = moment_fn(key, v).contiguous()
                opt.state[new] = state
            group["params"][0] = new
        self.model.params[name] = new

    def _apply(self, fn, param_fn=None, moment_fn=None, stat_fn=None) -> None:
        """One row edit of every tensor: ``fn(v)``, or per kind ``param_fn(name, p)``,
        ``moment_fn(name, key, v)``, ``stat_fn(name, v)``; ids by ``fn`` (keep)."""
        self._drop_stale()
        fresh = dict(self._stats)
        for name in list(self.model.params.keys()):
            self._replace(
                name,
                (lambda p, name=name: param_fn(name, p)) if param_fn else fn,
                (lambda key, v, name=name: moment_fn(name, key, v)) if moment_fn else (lambda _k, v: fn(v)),
            )
        for name, v in fresh.items():
            if v is not None:
                self._stats[name] = stat_fn(name, v) if stat_fn else fn(v)
        if fn is not None:
            self.model.ids = fn(self.model.ids)

    def _drop_stale(self) -> None:
        """Forgets stale statistics before an edit, so that none looks fresh
        after it by having the new row count by chance."""
        for name in self._stats:
            if self.stat(name) is None:
                self._stats[name] = None


def _is_row_moment(key: str, v) -> bool:
    return key != "step" and torch.is_tensor(v) and v.dim() > 0


def _on(index: Index, device: torch.device) -> Index:
    return index.to(device) if torch.is_tensor(index) else index


# --------------------------------------------------- the checkpoint form
def _ids(ckpt: dict) -> torch.Tensor:
    """The ids of a checkpoint (0 .. n-1 for files written before ids)."""
    ids = ckpt.get("ids")
    return ids if ids is not None else torch.arange(ckpt["params"]["means"].shape[0])


def _row_entries(ckpt: dict) -> List[Tuple[Callable, Callable]]:
    """(getter, setter) pairs of every per-primitive tensor of a checkpoint;
    stale statistics are set to None on the way."""
    entries = []
    for name in ckpt["params"]:
        entries.append((lambda c, k=name: c["params"][k], lambda c, v, k=name: c["params"].__setitem__(k, v)))
    for name in ckpt["params"]:
        state = ckpt.get("optimizers", {}).get(name, {}).get("state", {})
        for key, v in state[0].items() if 0 in state else ():
            if _is_row_moment(key, v):
                entries.append(
                    (
                        lambda c, n=name, k=key: c["optimizers"][n]["state"][0][k],
                        lambda c, v, n=name, k=key: c["optimizers"][n]["state"][0].__setitem__(k, v),
                    )
                )
    n = ckpt["params"]["means"].shape[0]
    stats = ckpt.get("row_stats") or {}
    for key, v in stats.items():
        if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == n:
            entries.append((lambda c, k=key: c["row_stats"][k], lambda c, v, k=key: c["row_stats"].__setitem__(k, v)))
        else:
            stats[key] = None  # stale: its owner starts it afresh
    entries.append((_ids, lambda c, v: c.__setitem__("ids", v)))
    return entries


def _copy_without_rows(ckpt: dict) -> dict:
    """A deep copy of ``ckpt`` whose per-primitive tensors are shared, not
    copied: the callers replace every one of them, and a copy of the whole
    model per call is what a resume on another world size cannot afford."""
    rows = [get(ckpt) for get, _ in _row_entries(ckpt)]
    return copy.deepcopy(ckpt, memo={id(t): t for t in rows})
