"""Checkpoints of a model spread over ranks (issue 23).

One process writes one file, ``OUT/checkpoints/ckpt_<step>_<run>.pt``
(:mod:`splat.checkpoint`).  N processes write, for the same step::

    OUT/checkpoints/ckpt_<step>_<run>.shards/rank<r>-of-<N>.pt   every rank its shard, atomically
    OUT/checkpoints/ckpt_<step>_<run>.json                       the manifest, by rank 0, last

A shard holds what a one-process checkpoint holds, for that rank's surfels
(parameters, their Adam moments and densification statistics, their
``ids``) plus the run's shared state (step, RNG, appearance, config).  Rank
0 writes the manifest only after every rank has written its shard (a
barrier), so a checkpoint counts once its manifest exists and names files
of the sizes it lists; a run killed half-way through leaves an incomplete
one that is ignored and later deleted.

Resuming (:func:`load_latest_checkpoint`):

* with the world size that wrote it, rank r loads shard r as it is, so the
  run continues bitwise;
* with another world size (one-process files included), every rank merges
  all shards into the whole model, rows sorted by id (the order one process
  keeps), and takes its balanced slice
  (:func:`splat.distributed.shard.balanced_slice`).

Renderers and the viewer call it without a group and get the whole model.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import torch

from ..checkpoint import (CKPT_PREFIX, _check_checkpoint, atomic_write, atomic_write_bytes, checkpoint_path,
                          list_checkpoints)
from ..errors import RunStateError
from ..model import PARAM_NAMES
from .group import Group
from .shard import balanced_slice

_MANIFEST_RE = re.compile(rf"^{CKPT_PREFIX}(\d+)_([0-9a-f]+)\.json$")
#: Per-surfel entries of a checkpoint's strategy state (DefaultStrategy.ROW_KEYS).
STRATEGY_ROW_KEYS = ("grad2d", "count", "radii")
_MOMENTS = ("exp_avg", "exp_avg_sq")


def shard_dir(out_dir: Path, step: int, run_id: str) -> Path:
    return checkpoint_path(out_dir, step, run_id).with_suffix(".shards")


def manifest_path(out_dir: Path, step: int, run_id: str) -> Path:
    return checkpoint_path(out_dir, step, run_id).with_suffix(".json")


def shard_name(rank: int, world: int) -> str:
    return f"rank{rank}-of-{world}.pt"


# ------------------------------------------------------------------ saving
def save_sharded(out_dir: Path, state: dict, group: Group) -> Path:
    """Every rank writes its ``state`` (with ``state["step"]`` and
    ``state["run_id"]``); rank 0 writes the manifest once all are written.
    Returns the manifest's path.  Collective."""
    import torch.distributed as dist

    step, run_id = int(state["step"]), state["run_id"]
    folder = shard_dir(out_dir, step, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / shard_name(group.rank, group.world_size)
    atomic_write(path, lambda f: torch.save(state, f))
    sizes = [None] * group.world_size
    dist.all_gather_object(sizes, path.stat().st_size)  # also the barrier: every shard is on disk
    manifest = manifest_path(out_dir, step, run_id)
    if group.is_main:
        body = {"step": step, "run_id": run_id, "world_size": group.world_size,
                "shards": [{"file": shard_name(r, group.world_size), "bytes": sizes[r]}
                           for r in range(group.world_size)]}
        atomic_write_bytes(manifest, (json.dumps(body, indent=2) + "\n").encode())
    return manifest


def prune(out_dir: Path, run_id: str, step: int, keep: int) -> List[Path]:
    """Keeps this run's newest ``keep`` complete checkpoints at or below
    ``step`` (one-process files and manifests alike) and deletes the older
    ones, and any shard folder without a manifest below ``step``.  Returns
    the deleted checkpoints' paths (files or manifests)."""
    complete = [c for c in _complete_checkpoints(out_dir, run_id) if c["step"] <= step]
    removed = [c["path"] for c in complete[max(int(keep), 1):]]
    for path in removed:
        _delete(path)
    d = Path(out_dir) / "checkpoints"
    for folder in d.glob(f"{CKPT_PREFIX}*_{run_id}.shards"):
        s = int(folder.name[len(CKPT_PREFIX):].split("_")[0])
        if s < step and not manifest_path(out_dir, s, run_id).exists():
            shutil.rmtree(folder, ignore_errors=True)
    return removed


def _delete(path: Path) -> None:
    path = Path(path)
    if path.suffix == ".json":
        path.unlink(missing_ok=True)  # the manifest first: the checkpoint stops counting at once
        shutil.rmtree(path.with_suffix(".shards"), ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ----------------------------------------------------------------- loading
def _complete_checkpoints(out_dir: Path, run_id: Optional[str]) -> List[dict]:
    """This run's complete checkpoints, newest first: ``{"step", "path",
    "shards": [paths]}``; a manifest counts when every shard it lists exists
    with the size it lists."""
    found = [{"step": int(_step_of(p)), "path": p, "shards": [p]} for p in list_checkpoints(out_dir, run_id)]
    d = Path(out_dir) / "checkpoints"
    if d.is_dir():
        for p in d.iterdir():
            m = _MANIFEST_RE.match(p.name)
            if not m or (run_id is not None and m.group(2) != run_id):
                continue
            try:
                body = json.loads(p.read_text())
                shards = [p.with_suffix(".shards") / s["file"] for s in body["shards"]]
                if all(f.is_file() and f.stat().st_size == s["bytes"] for f, s in zip(shards, body["shards"])):
                    found.append({"step": int(m.group(1)), "path": p, "shards": shards})
            except (OSError, ValueError, KeyError, TypeError):
                print(f"warning: skipping unreadable checkpoint manifest {p}", file=sys.stderr)
    return sorted(found, key=lambda c: c["step"], reverse=True)


def _step_of(path: Path) -> int:
    return int(Path(path).name[len(CKPT_PREFIX):].split("_")[0])


def _load(path: Path, run_id: Optional[str]) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if path.parent.suffix == ".shards":  # a shard: its step is in its folder's name
        if not isinstance(ckpt, dict) or ckpt.get("step") != _step_of(path.parent):
            raise ValueError("not a shard of this checkpoint")
    else:
        _check_checkpoint(ckpt, path, run_id)
    return ckpt


def load_latest_checkpoint(out_dir: Path, run_id: Optional[str] = None, group: Optional[Group] = None,
                           quarantine: bool = False) -> Optional[dict]:
    """The newest complete checkpoint for this rank of ``group`` (default:
    one process, the whole model), or None; see the module doc.  With a
    group it is collective: rank 0 picks the checkpoint, every rank loads
    it, and an unreadable shard is a RunStateError on every rank."""
    group = group or Group()
    candidates = _complete_checkpoints(out_dir, run_id)
    if group.distributed:
        # Rank 0's list, newest first; each is tried by every rank, and one
        # that any rank cannot read is skipped by all.
        import torch.distributed as dist

        box = [[str(c["path"]) for c in candidates]]
        dist.broadcast_object_list(box, src=0)
        mine = {str(c["path"]): c for c in candidates}
        for path in box[0]:
            try:
                return _load_for_rank(mine.get(path), run_id, group, path)
            except RunStateError as e:
                if group.is_main:
                    print(f"warning: skipping checkpoint {path}: {e}", file=sys.stderr)
        return None
    for c in candidates:
        try:
            return _load_for_rank(c, run_id, group)
        except Exception as e:  # truncated / corrupt / foreign file
            note = ""
            if quarantine and c["path"].suffix == ".pt":
                c["path"].replace(c["path"].with_name(c["path"].name + ".corrupt"))
                note = " (renamed to *.corrupt)"
            print(f"warning: skipping unreadable checkpoint {c['path']}: {type(e).__name__}: {e}{note}",
                  file=sys.stderr)
    return None


def _load_for_rank(c: Optional[dict], run_id: Optional[str], group: Group, path: Optional[str] = None) -> dict:
    """This rank's part of checkpoint ``c`` (None: not complete on this rank).
    With a group, collective: a RunStateError on every rank if any rank
    cannot read its part."""
    try:
        if c is None:
            raise FileNotFoundError(f"{path} is not complete on rank {group.rank}")
        shards = c["shards"]
        if len(shards) == group.world_size:
            ckpt = _load(shards[group.rank], run_id)
        else:
            whole = merge_shards([_load(p, run_id) for p in shards])
            start, stop = balanced_slice(len(whole["ids"]), group.world_size, group.rank)
            ckpt = slice_rows(whole, start, stop)
        error = None
    except Exception as e:
        ckpt, error = None, f"{type(e).__name__}: {e}"
    if group.distributed:
        import torch.distributed as dist

        errors = [None] * group.world_size
        dist.all_gather_object(errors, error)
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            raise RunStateError(f"rank {bad[0][0]} cannot read its part ({bad[0][1]})")
    elif error:
        raise RuntimeError(error)
    ckpt["path"] = str(c["path"])
    return ckpt


def _ids(ckpt: dict) -> torch.Tensor:
    """The surfel ids of a checkpoint (0 .. n-1 for files written before ids)."""
    ids = ckpt.get("ids")
    return ids if ids is not None else torch.arange(ckpt["params"]["means"].shape[0])


def _row_entries(ckpt: dict):
    """(getter, setter) pairs of every per-surfel tensor of a checkpoint."""
    entries = [(lambda c, k=k: c["params"][k], lambda c, v, k=k: c["params"].__setitem__(k, v))
               for k in PARAM_NAMES]
    for name in PARAM_NAMES:
        state = ckpt.get("optimizers", {}).get(name, {}).get("state", {})
        for key in _MOMENTS:
            if 0 in state and key in state[0]:
                entries.append((lambda c, n=name, k=key: c["optimizers"][n]["state"][0][k],
                                lambda c, v, n=name, k=key: c["optimizers"][n]["state"][0].__setitem__(k, v)))
    n = ckpt["params"]["means"].shape[0]
    strategy = ckpt.get("strategy") or {}
    for key in STRATEGY_ROW_KEYS:
        v = strategy.get(key)
        if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == n:
            entries.append((lambda c, k=key: c["strategy"][k], lambda c, v, k=key: c["strategy"].__setitem__(k, v)))
        elif key in strategy:
            strategy[key] = None  # stale statistics: the next step starts them afresh
    entries.append((_ids, lambda c, v: c.__setitem__("ids", v)))
    return entries


def merge_shards(shards: List[dict]) -> dict:
    """One checkpoint of the whole model from a run's shards (in rank order):
    per-surfel tensors concatenated, then sorted by id; the shared state is
    rank 0's."""
    whole = _copy_without_rows(shards[0])
    entries = _row_entries(whole)
    for get, put in entries:
        put(whole, torch.cat([get(s) for s in shards]))
    if len(entries) != len(_row_entries(whole)):
        raise ValueError("shards disagree on their optimiser or strategy state")
    order = torch.argsort(_ids(whole))
    for get, put in _row_entries(whole):
        put(whole, get(whole)[order])
    whole["next_id"] = max(int(s.get("next_id", len(_ids(s)))) for s in shards)
    return whole


def slice_rows(ckpt: dict, start: int, stop: int) -> dict:
    """The checkpoint of rows [start, stop) of ``ckpt``'s model."""
    part = _copy_without_rows(ckpt)
    for get, put in _row_entries(part):
        put(part, get(part)[start:stop].clone())
    return part


def _copy_without_rows(ckpt: dict) -> dict:
    """A deep copy of ``ckpt`` whose per-surfel tensors are shared, not
    copied: the callers replace every one of them, and a copy of the whole
    model per call is what a resume on another world size cannot afford."""
    import copy

    rows = [get(ckpt) for get, _ in _row_entries(ckpt)]
    return copy.deepcopy(ckpt, memo={id(t): t for t in rows})
