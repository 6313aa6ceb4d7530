"""Run I/O: atomic writes, checkpoints and the RNG state they carry.

Output folder layout (see ``splat/trainer.py``)::

    OUT/config.yaml                   resolved config (every field)
    OUT/checkpoints/ckpt_NNNNNNN.pt   atomic checkpoints (the newest ``checkpoint.keep``)

Every file is written atomically (temp file in the same folder, fsync,
``os.replace``), so a reader, or a run resumed after SIGKILL, sees either
the old file or the complete new one.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from .config import config_to_yaml


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
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


# ------------------------------------------------------------ checkpoints
CKPT_PREFIX = "ckpt_"


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"{CKPT_PREFIX}{step:07d}.pt"


def list_checkpoints(out_dir: Path) -> List[Path]:
    """Complete checkpoint files, newest (highest step) first.  Temp files
    (``.ckpt_*.tmpPID``) left by a killed writer never match."""
    d = Path(out_dir) / "checkpoints"
    if not d.is_dir():
        return []
    found = []
    for p in d.glob(f"{CKPT_PREFIX}*.pt"):
        try:
            found.append((int(p.stem[len(CKPT_PREFIX):]), p))
        except ValueError:
            continue
    return [p for _, p in sorted(found, reverse=True)]


def load_latest_checkpoint(out_dir: Path) -> Optional[dict]:
    """The newest checkpoint that loads; unreadable ones are skipped with a
    warning (defence in depth: atomic writes should make them impossible)."""
    for p in list_checkpoints(out_dir):
        try:
            ckpt = torch.load(p, map_location="cpu", weights_only=True)
            if not isinstance(ckpt, dict) or "step" not in ckpt:
                raise ValueError("not a splat checkpoint")
            ckpt["path"] = str(p)
            return ckpt
        except Exception as e:  # truncated / corrupt file
            print(f"warning: skipping unreadable checkpoint {p}: {type(e).__name__}: {e}", file=sys.stderr)
    return None


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
    np.random.set_state(
        ("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
