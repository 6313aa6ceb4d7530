"""Checkpoints of a run: what one holds, and saving, finding, loading and
pruning them, on one process or several.

Layout (:func:`checkpoint_state`): the step, the per-primitive table
(:meth:`splat.state.PrimitiveState.state_dict`: ``params``, ``ids``,
``next_id``, ``row_stats``), every optimiser's state dict (the Adam moments
inside), the strategy's other state, the appearance and pose corrections, the global
RNGs' state, the training time, the config and the run id.

One process writes one file, ``OUT/checkpoints/ckpt_<step>_<run>.pt``
(named by :mod:`splat.run_folder`).  N processes write, for the same step::

    OUT/checkpoints/ckpt_<step>_<run>.shards/rank<r>-of-<N>.pt   every rank its shard, atomically
    OUT/checkpoints/ckpt_<step>_<run>.json                       the manifest, by rank 0, last

A shard holds what a one-process checkpoint holds, for that rank's
primitives, plus the run's shared state.  Rank 0 writes the manifest only
after every rank has written its shard (a barrier), so a checkpoint counts
once its manifest exists and names files of the sizes it lists; a run
killed half-way through leaves an incomplete one that is ignored and later
deleted.  The manifest also lists each shard's primitive count.  A manifest
is not taken on trust (it is a text file a person can edit): one whose
shards are not exactly ``rank0-of-N.pt`` ... ``rank<N-1>-of-N.pt`` for its
``world_size``, a shard whose rank, world size or primitive count disagrees
with it, or shards whose ids repeat, make the checkpoint unreadable: it is
skipped with a one-line warning like a garbled shard, and the run resumes
from the checkpoint before.

Resuming (:func:`load_latest_checkpoint`):

* with the world size that wrote it, rank r loads shard r as it is, so the
  run continues bitwise;
* with another world size (one-process files included), every rank merges
  all shards into the whole model, rows sorted by id (the order one process
  keeps), and takes its balanced slice (:meth:`splat.state.PrimitiveState.merge`,
  :meth:`~splat.state.PrimitiveState.slice`): every registered per-row
  statistic is re-split with its rows.

Renderers and the viewer call it without a group and get the whole model.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from .distributed.group import Group
from .errors import RunStateError
from .run_folder import (
    CKPT_PREFIX,
    _check_checkpoint,
    atomic_write,
    atomic_write_bytes,
    checkpoint_path,
    list_checkpoints,
)
from .state import PrimitiveState

_MANIFEST_RE = re.compile(rf"^{CKPT_PREFIX}(\d+)_([0-9a-f]+)\.json$")


def shard_dir(out_dir: Path, step: int, run_id: str) -> Path:
    return checkpoint_path(out_dir, step, run_id).with_suffix(".shards")


def manifest_path(out_dir: Path, step: int, run_id: str) -> Path:
    return checkpoint_path(out_dir, step, run_id).with_suffix(".json")


def shard_name(rank: int, world: int) -> str:
    return f"rank{rank}-of-{world}.pt"


# ------------------------------------------------------------------ layout
def checkpoint_state(
    step: int,
    table: PrimitiveState,
    optimizers: Dict[str, torch.optim.Optimizer],
    strategy,
    appearance: Optional[torch.nn.Module],
    pose: Optional[torch.nn.Module],
    train_seconds: float,
    cfg: Dict,
    run_id: str,
    group: Group,
) -> dict:
    """What a checkpoint of step ``step`` holds (see the module doc); on
    several processes, this rank's part."""
    state = {
        "step": step,
        "sh_degree": table.model.sh_degree,
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "strategy": strategy.state_dict(),
        "appearance": None if appearance is None else {k: v.detach().cpu() for k, v in appearance.state_dict().items()},
        "pose": None if pose is None else {k: v.detach().cpu() for k, v in pose.state_dict().items()},
        "rng": rng_state(),
        "train_seconds": train_seconds,
        "config": cfg,
        "run_id": run_id,
        "rank": group.rank,
        "world_size": group.world_size,
    }
    state.update(table.state_dict())
    return state


def save_checkpoint(out_dir: Path, state: dict, keep: int, group: Group) -> Path:
    """Writes ``state`` (:func:`checkpoint_state`) as this step's checkpoint
    (several processes: this rank's shard, and the manifest from rank 0 once
    all are written) and deletes this run's checkpoints beyond the newest
    ``keep``.  Returns the file's or manifest's path.  Collective."""
    step, run_id = int(state["step"]), state["run_id"]
    if group.distributed:
        path = save_sharded(out_dir, state, group)
        if group.is_main:
            prune(out_dir, run_id, step, keep)
        return path
    path = checkpoint_path(out_dir, step, run_id)
    atomic_write(path, lambda f: torch.save(state, f))
    prune(out_dir, run_id, step, keep)
    return path


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
    mine = (path.stat().st_size, int(state["params"]["means"].shape[0]))
    dist.all_gather_object(sizes, mine)  # also the barrier: every shard is on disk
    if group.is_main:
        return write_manifest(out_dir, step, run_id, sizes)
    return manifest_path(out_dir, step, run_id)


def write_manifest(out_dir: Path, step: int, run_id: str, shards: List[tuple]) -> Path:
    """Writes the manifest of the shards written for ``step``: ``shards`` is
    (bytes, primitives) of each rank's file, in rank order."""
    world = len(shards)
    body = {
        "step": step,
        "run_id": run_id,
        "world_size": world,
        "shards": [
            {"file": shard_name(r, world), "bytes": int(size), "primitives": int(rows)}
            for r, (size, rows) in enumerate(shards)
        ],
    }
    manifest = manifest_path(out_dir, step, run_id)
    atomic_write_bytes(manifest, (json.dumps(body, indent=2) + "\n").encode())
    return manifest


def prune(out_dir: Path, run_id: str, step: int, keep: int) -> List[Path]:
    """Keeps this run's newest ``keep`` complete checkpoints at or below
    ``step`` (one-process files and manifests alike) and deletes the older
    ones, and any shard folder without a manifest below ``step``.  Returns
    the deleted checkpoints' paths (files or manifests)."""
    complete = [c for c in _complete_checkpoints(out_dir, run_id, warn=False) if c["step"] <= step]
    removed = [c["path"] for c in complete[max(int(keep), 1) :]]
    for path in removed:
        _delete(path)
    d = Path(out_dir) / "checkpoints"
    for folder in d.glob(f"{CKPT_PREFIX}*_{run_id}.shards"):
        s = int(folder.name[len(CKPT_PREFIX) :].split("_")[0])
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
def _complete_checkpoints(out_dir: Path, run_id: Optional[str], warn: bool = True) -> List[dict]:
    """This run's complete checkpoints, newest first: ``{"step", "path",
    "shards": [paths], "counts": [primitives per shard, or None]}``; a
    manifest counts when every shard it lists exists with the size it lists.
    A manifest that is unreadable or disagrees with itself (see the module
    doc) is left out, with a one-line warning if ``warn``."""
    found = [
        {"step": int(_step_of(p)), "path": p, "shards": [p], "counts": [None]}
        for p in list_checkpoints(out_dir, run_id)
    ]
    d = Path(out_dir) / "checkpoints"
    if d.is_dir():
        for p in d.iterdir():
            m = _MANIFEST_RE.match(p.name)
            if not m or (run_id is not None and m.group(2) != run_id):
                continue
            try:
                body = json.loads(p.read_text())
                listed = body["shards"]
                problem = _manifest_problem(body, int(m.group(1)))
                if problem:
                    if warn:
                        print(f"warning: skipping checkpoint {p}: {problem}", file=sys.stderr)
                    continue
                shards = [p.with_suffix(".shards") / s["file"] for s in listed]
                if all(f.is_file() and f.stat().st_size == s["bytes"] for f, s in zip(shards, listed)):
                    counts = [s.get("primitives") for s in listed]
                    found.append({"step": int(m.group(1)), "path": p, "shards": shards, "counts": counts})
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                if warn:
                    print(f"warning: skipping unreadable checkpoint manifest {p}", file=sys.stderr)
    return sorted(found, key=lambda c: c["step"], reverse=True)


def newest_checkpoint_step(out_dir: Path, run_id: Optional[str] = None) -> Optional[int]:
    """The step of the newest complete checkpoint (of run ``run_id`` if
    given), by its name, without reading it; None if there is none."""
    found = _complete_checkpoints(out_dir, run_id, warn=False)
    return found[0]["step"] if found else None


def _manifest_problem(body: dict, step: int) -> Optional[str]:
    """What is wrong with a manifest's list of shards, or None.  A manifest
    missing a shard would resume with part of the model, one listing a shard
    twice with duplicated primitives, and neither fails on loading."""
    world = body["world_size"]
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return f"its world_size is {world!r}"
    if body.get("step", step) != step:
        return f"it says step {body['step']!r}, its name {step}"
    names = [s["file"] for s in body["shards"]]
    expected = [shard_name(r, world) for r in range(world)]
    if names != expected:
        return f"it lists shards {names} for world_size {world} (expected {expected})"
    for s in body["shards"]:
        n = s.get("primitives")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            return f"it lists {n!r} primitives for {s['file']}"
    return None


def _step_of(path: Path) -> int:
    return int(Path(path).name[len(CKPT_PREFIX) :].split("_")[0])


def _load(path: Path, run_id: Optional[str], rank: Optional[int] = None, count: Optional[int] = None) -> dict:
    """A checkpoint file, or shard ``rank`` of its manifest (``count``: the
    primitives the manifest lists for it); ValueError (one line, naming the
    file) if it is unreadable or disagrees with its name or manifest."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's message is several lines of advice about weights_only
        raise ValueError(f"{path}: not a torch file, or one holding more than a checkpoint does") from None
    except Exception as e:  # a truncated or garbled zip archive, a read error
        raise ValueError(f"{path}: {_one_line(e)}") from None
    if path.parent.suffix == ".shards":  # a shard: its step is in its folder's name
        if not isinstance(ckpt, dict) or ckpt.get("step") != _step_of(path.parent):
            raise ValueError(f"{path}: not a shard of this checkpoint")
        world = int(path.name.split("-of-")[1].split(".")[0])
        held = (ckpt.get("rank"), ckpt.get("world_size"))
        if held not in ((rank, world), (None, None)):
            raise ValueError(f"{path}: holds rank {held[0]} of {held[1]}, its manifest says {rank} of {world}")
        params = ckpt.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("means"), torch.Tensor):
            raise ValueError(f"{path}: has no model parameters")
        n = int(params["means"].shape[0])
        ids = ckpt.get("ids")
        if count is not None and n != count:
            raise ValueError(f"{path}: holds {n} primitives, its manifest says {count}")
        if ids is not None and len(ids) != n:
            raise ValueError(f"{path}: holds {n} primitives but {len(ids)} ids")
    else:
        _check_checkpoint(ckpt, path, run_id)
    return ckpt


def _one_line(e: BaseException) -> str:
    """``Type: message`` folded to one line (torch's messages run to several)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' '.join(lines)}" if lines else type(e).__name__


def load_latest_checkpoint(
    out_dir: Path, run_id: Optional[str] = None, group: Optional[Group] = None, quarantine: bool = False
) -> Optional[dict]:
    """The newest complete checkpoint for this rank of ``group`` (default:
    one process, the whole model), or None; see the module doc.  With a
    group it is collective: rank 0 picks the checkpoint, every rank loads
    it, and an unreadable shard is a RunStateError on every rank."""
    group = group or Group()
    candidates = _complete_checkpoints(out_dir, run_id, warn=group.is_main)
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
            print(f"warning: skipping unreadable checkpoint {c['path']}: {_reason(e)}{note}", file=sys.stderr)
    return None


def _load_for_rank(c: Optional[dict], run_id: Optional[str], group: Group, path: Optional[str] = None) -> dict:
    """This rank's part of checkpoint ``c`` (None: not complete on this rank).
    With a group, collective: a RunStateError on every rank if any rank
    cannot read its part."""
    try:
        if c is None:
            raise FileNotFoundError(f"{path} is not complete on rank {group.rank}")
        shards, counts = c["shards"], c["counts"]
        if len(shards) == group.world_size:
            ckpt = _load(shards[group.rank], run_id, group.rank, counts[group.rank])
        else:
            parts = [_load(p, run_id, r, counts[r]) for r, p in enumerate(shards)]
            ids = [s["ids"] for s in parts if s.get("ids") is not None]
            if ids and len(torch.cat(ids).unique()) != sum(len(i) for i in ids):
                raise ValueError(f"{c['path']}: its shards hold the same primitive ids more than once")
            whole = PrimitiveState.merge(parts)
            ckpt = PrimitiveState.slice(whole, group.world_size, group.rank)
        error = None
    except Exception as e:
        ckpt, error = None, _reason(e)
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


def _reason(e: BaseException) -> str:
    """Why a checkpoint was skipped, in one line: our ValueErrors name the
    file; anything else keeps its type."""
    return _one_line(e).split(": ", 1)[1] if type(e) is ValueError and str(e) else _one_line(e)


# ------------------------------------------------------------- global RNGs
def rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
