"""A run's output folder: its identity, the claim and lock on the folder,
atomic writes, and the names of its checkpoint files.

Output folder layout (see ``splat/trainer.py``)::

    OUT/run.json                              run identity (run_id, data fingerprint, identity config)
    OUT/config.yaml                           resolved config (every field)
    OUT/checkpoints/ckpt_NNNNNNN_<run_id>.pt  atomic checkpoints (the newest ``checkpoint.keep``)
    OUT/checkpoints/ckpt_NNNNNNN_<run_id>.json / .shards/   the same from several processes
    OUT/.lock                                 held (flock) while a trainer owns OUT

What a checkpoint holds, and saving, finding, loading and pruning them
(one file, or one shard per process), is :mod:`splat.checkpoints`' job.

A run's identity is a digest of its config (less :data:`RESUMABLE_KEYS`)
and of the loaded training data.  A trainer refuses a folder holding another
run (unless told to overwrite it), resumes only its own checkpoints, and
its keep policy deletes only its own older checkpoints.

Every file is written atomically (temp file in the same folder, fsync,
``os.replace``), so a reader, or a run resumed after SIGKILL, sees either
the old file or the complete new one.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from .config import config_to_yaml
from .errors import RunStateError, interrupt_behind


def save_config(cfg: Dict, path: Path) -> None:
    atomic_write_bytes(Path(path), config_to_yaml(cfg).encode())


# --------------------------------------------------------- atomic writes
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write_fn) -> None:
    """Write via ``write_fn(fileobj)`` to a temp file in the same folder, fsync
    it, then ``os.replace`` it onto ``path``: readers see the old file or the
    complete new one, never a partial one, even after SIGKILL or power loss."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        interrupt = interrupt_behind(e)
        if interrupt is not None and interrupt is not e:
            # Ctrl+C or SIGTERM (Terminated) landed mid-write, and the writer's
            # own clean-up then failed on the half-written file (torch.save's
            # zip writer raises "unexpected pos"): the interrupt is what
            # happened, and the CLI reports it in one line.
            raise interrupt from None
        full = _disk_full_behind(e)
        if full is not None:
            # torch.save's zip writer then fails again on the short file
            # ("unexpected pos"): a chained traceback on every rank, where
            # the user needs the folder and the space.
            raise RunStateError(_disk_full_message(path, full)) from None
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def _disk_full_behind(e: BaseException) -> Optional[OSError]:
    """The "no space left" / "quota exceeded" OSError that ``e`` is, or was
    raised while handling, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return e
        seen.add(id(e))
        e = e.__context__
    return None


def _disk_full_message(path: Path, e: OSError) -> str:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    what = "no space left on the device" if e.errno == errno.ENOSPC else "disk quota exceeded"
    return (
        f"{path.parent}: {what} ({free}) while writing {path.name}: free some space; "
        "a training run continues from its last complete checkpoint with --resume"
    )


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


# ------------------------------------------------------------ run identity
#: Config keys that may differ between a run and its resumption.  Everything
#: else (seed, data, model, learning rates, losses, strategy, near/far)
#: defines the run: a checkpoint written under other values is refused.
#: - ``train.iterations``: train longer (or stop earlier, not below the
#:   checkpoint's step).  The ``means`` learning rate decays over
#:   ``train.iterations``, so the remaining steps follow the new schedule.
#: - ``checkpoint.*``, ``log.*``: bookkeeping.
#: - ``device``, ``render.backend``: where it runs (backends agree to float
#:   rounding, so only a same-device resume is bitwise equal).
#: - ``render.depth``: which depth the evaluation reports.
#: - ``eval.*``: which test figures the evaluation reports (the test masks
#:   it reads are not training data).
#: - ``data.path``: where the data lives; its content is fingerprinted.
RESUMABLE_KEYS = (
    "train.iterations",
    "checkpoint",
    "log",
    "device",
    "render.backend",
    "render.depth",
    "eval",
    "data.path",
    "distributed",
)


def identity_config(cfg: Dict) -> Dict:
    """``cfg`` without the :data:`RESUMABLE_KEYS`."""
    out = copy.deepcopy(cfg)
    for key in RESUMABLE_KEYS:
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node.get(p, {})
        node.pop(last, None)
    return out


def _sha256_tensor(h, t) -> None:
    if t is None:
        h.update(b"none")
        return
    a = np.ascontiguousarray(t.detach().cpu().numpy())
    h.update(f"{a.dtype.str}{a.shape}".encode())
    if a.size:  # memoryview cannot cast an empty array; the shape above already tells it apart
        h.update(memoryview(a).cast("B"))


def scene_fingerprint(scene) -> str:
    """SHA-256 of the loaded scene: every frame's name, size, cameras, pixels
    and mask, and the point cloud (what training sees, wherever it lives)."""
    h = hashlib.sha256()
    for split, frames in (("train", scene.train), ("test", scene.test)):
        h.update(f"{split}:{len(frames)}".encode())
        for f in frames:
            h.update(f"{f.stem}:{f.width}x{f.height}".encode())
            for t in (f.image, f.mask, f.viewmat, f.K):
                _sha256_tensor(h, t)
    _sha256_tensor(h, scene.points)
    _sha256_tensor(h, scene.point_colors)
    return h.hexdigest()


def run_identity(cfg: Dict, scene) -> Dict:
    """``{"run_id", "data_fingerprint", "config"}``: the run id is a 16-hex
    digest of the identity config (see :data:`RESUMABLE_KEYS`) and the data."""
    ident = identity_config(cfg)
    data = scene_fingerprint(scene)
    text = json.dumps({"config": ident, "data": data}, sort_keys=True)
    return {"run_id": hashlib.sha256(text.encode()).hexdigest()[:16], "data_fingerprint": data, "config": ident}


def _flatten(d: Dict, prefix: str = "") -> Dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def describe_difference(old: Dict, new: Dict) -> str:
    """Human-readable difference of two :func:`run_identity` results."""
    a, b = _flatten(old.get("config", {})), _flatten(new["config"])
    parts = [
        f"{k}: {a.get(k, '<unset>')!r} there, {b.get(k, '<unset>')!r} now"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    if old.get("data_fingerprint") != new["data_fingerprint"]:
        parts.append("the training data (images, cameras or points) differ")
    return "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "") or "nothing known"


# ---------------------------------------------------------- output folder
RUN_FILE = "run.json"
#: Files and folders of a run in OUT (removed by ``--overwrite``).
RUN_OUTPUTS = (RUN_FILE, "config.yaml", "checkpoints", "point_cloud.ply", "metrics.json", "renders", "mesh.ply")
_TMP_RE = re.compile(r"^\..+\.tmp\d+$")


def check_out_dir(out_dir: Path) -> Path:
    """Create ``out_dir`` if needed; RunStateError if it is a file or not writable."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunStateError(f"{out_dir}: output folder is a file")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write_probe.tmp{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunStateError(f"{out_dir}: output folder is not writable ({e.strerror or e})") from None
    return out_dir


class RunLock:
    """Exclusive advisory lock on ``OUT/.lock`` while a trainer owns OUT; the
    kernel drops it when the process dies (even by SIGKILL)."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / ".lock"
        self._f = open(self.path, "a+")
        try:
            import fcntl

            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock
            pass
        except OSError:
            self._f.close()
            raise RunStateError(f"{out_dir}: another training process is using this output folder") from None

    def release(self) -> None:
        if not self._f.closed:
            self._f.close()


def clean_temp_files(out_dir: Path) -> List[Path]:
    """Remove temp files (``.NAME.tmpPID``) left by a killed writer; call it
    with the run lock held, so no live writer owns them."""
    removed = []
    ckpts = Path(out_dir) / "checkpoints"
    shard_dirs = sorted(ckpts.glob("*.shards")) if ckpts.is_dir() else []  # several processes' checkpoints
    for d in (Path(out_dir), ckpts, *shard_dirs):
        if d.is_dir():
            for p in d.iterdir():
                if _TMP_RE.match(p.name) and p.is_file():
                    p.unlink(missing_ok=True)
                    removed.append(p)
    return removed


def read_run_file(out_dir: Path) -> Optional[Dict]:
    p = Path(out_dir) / RUN_FILE
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
        return data if isinstance(data, dict) and "run_id" in data else {"run_id": "<unreadable>"}
    except (OSError, ValueError):
        return {"run_id": "<unreadable>"}


def run_state(out_dir: Path) -> List[str]:
    """Names of the run outputs present in ``out_dir``."""
    out_dir = Path(out_dir)
    found = [n for n in RUN_OUTPUTS if n != "checkpoints" and (out_dir / n).exists()]
    if any((out_dir / "checkpoints").glob(f"{CKPT_PREFIX}*")):
        found.append("checkpoints")
    return found


def remove_run(out_dir: Path) -> None:
    """Delete the run outputs (:data:`RUN_OUTPUTS`) of ``out_dir``, nothing else."""
    out_dir = Path(out_dir)
    for name in RUN_OUTPUTS:
        p = out_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def claim_out_dir(out_dir: Path, identity: Dict, resume: bool, overwrite: bool) -> None:
    """Check that ``out_dir`` may hold the run ``identity`` and record it in
    ``OUT/run.json``.  Call with the :class:`RunLock` held.

    - ``overwrite``: the outputs of whatever run was there are deleted.
    - ``resume``: the folder must be empty or hold this same run.
    - otherwise the folder must hold no run outputs at all.
    """
    out_dir = Path(out_dir)
    if overwrite:
        remove_run(out_dir)
    state = run_state(out_dir)
    old = read_run_file(out_dir)
    others = sorted({rid for _, rid, _ in _checkpoint_files(out_dir)} - {identity["run_id"]})
    same = old is not None and old["run_id"] == identity["run_id"] and not others
    if state and not (resume and same):
        if old is None or old["run_id"] == "<unreadable>":
            what = f"another run's outputs ({', '.join(state)}) without a readable {RUN_FILE}"
        elif same:
            what = "this run already"
        else:
            what = f"another run ({old['run_id']}; differs in {describe_difference(old, identity)})"
        hint = (
            "use --resume to continue it, or --overwrite to start again"
            if same
            else ("choose another --out, or --overwrite to delete it")
        )
        raise RunStateError(f"{out_dir}: holds {what}: {hint}")
    atomic_write_bytes(out_dir / RUN_FILE, (json.dumps(identity, indent=2, sort_keys=True) + "\n").encode())


# ------------------------------------------------------------ checkpoints
CKPT_PREFIX = "ckpt_"
_CKPT_RE = re.compile(rf"^{CKPT_PREFIX}(\d+)_([0-9a-f]+)\.pt$")


def checkpoint_path(out_dir: Path, step: int, run_id: str) -> Path:
    """``OUT/checkpoints/ckpt_<step:07d>_<run_id>.pt``."""
    return Path(out_dir) / "checkpoints" / f"{CKPT_PREFIX}{step:07d}_{run_id}.pt"


def _checkpoint_files(out_dir: Path):
    """(step, run_id, path) of every checkpoint file name, newest first."""
    d = Path(out_dir) / "checkpoints"
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _CKPT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), m.group(2), p))
    return sorted(found, key=lambda x: (x[0], x[1]), reverse=True)


def list_checkpoints(out_dir: Path, run_id: Optional[str] = None) -> List[Path]:
    """Checkpoint files (of run ``run_id`` if given), newest (highest step)
    first.  Temp files (``.ckpt_*.tmpPID``) left by a killed writer and
    quarantined files (``*.corrupt``) never match."""
    return [p for _, rid, p in _checkpoint_files(out_dir) if run_id is None or rid == run_id]


def checkpoint_step(path: Path) -> int:
    return int(_CKPT_RE.match(Path(path).name).group(1))


def _check_checkpoint(ckpt, path: Path, run_id: Optional[str]) -> None:
    if not isinstance(ckpt, dict) or "step" not in ckpt:
        raise ValueError("not a splat checkpoint")
    if ckpt["step"] != checkpoint_step(path):
        raise ValueError(f"holds step {ckpt['step']!r}, its name says {checkpoint_step(path)}")
    params = ckpt.get("params")
    need = ("means", "quats", "scales", "opacities", "sh0", "shN")
    if not isinstance(params, dict) or any(not isinstance(params.get(k), torch.Tensor) for k in need):
        raise ValueError(f"has no model parameters ({', '.join(need)})")
    if run_id is not None and ckpt.get("run_id") != run_id:
        raise ValueError(f"belongs to run {ckpt.get('run_id')!r}, not {run_id}")
