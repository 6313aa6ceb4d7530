"""Every rank must run the same code on the same config and data.

Ranks started by hand, or nodes with their own checkouts and config files,
could differ, and nothing noticed: two ranks with different
``loss.ssim_lambda`` both trained and mixed the two configs into one model,
each named its checkpoint shards under its own run id (so no checkpoint was
ever complete, none was pruned, and ``--resume`` started from scratch), and
different data ran every step before a gloo abort.  :func:`check_same_run`
compares each rank's identity with rank 0's right after the scene is loaded
and refuses a difference on every rank, with one line naming the first
differing key, image or source file.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import ConfigError, SplatInputError
from .group import Group, all_gather_objects

#: Config keys that may differ between ranks: where the data lives on each
#: machine (the data themselves are compared by their fingerprint).
LOCAL_KEYS = ("data.path",)
_SOURCE_SUFFIXES = (".py", ".cpp", ".cu", ".cuh", ".h")


@functools.lru_cache(maxsize=1)
def code_identity() -> Dict[str, str]:
    """``{"version": splat.__version__, "<path in splat>": sha256[:16], ...}``
    over the package's Python and C++/CUDA sources (the compiled kernels are
    built from them; their bytes depend on the compiler)."""
    from .. import __version__

    root = Path(__file__).resolve().parents[1]
    out = {"version": __version__}
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES and p.is_file()):
        rel = path.relative_to(root.parent).as_posix()
        if "__pycache__" in rel:
            continue
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return out


def _flatten(d: Dict, prefix: str = "") -> Dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def rank_identity(cfg: Dict, scene, data_fingerprint: str) -> Dict:
    """What must agree between ranks: code, config (without
    :data:`LOCAL_KEYS`) and training data; small enough to gather."""
    config = {k: v for k, v in _flatten(cfg).items() if k not in LOCAL_KEYS}
    return {
        "code": code_identity(),
        "config": config,
        "data": {
            "path": str(cfg["data"]["path"]),
            "fingerprint": data_fingerprint,
            "train": [f.stem for f in scene.train],
            "test": [f.stem for f in scene.test],
        },
    }


def _first_difference(mine: Dict, theirs: Dict) -> Optional[str]:
    """The first key whose value differs, in ``theirs``' order then ``mine``'s."""
    for key in list(theirs) + [k for k in mine if k not in theirs]:
        if mine.get(key, "<unset>") != theirs.get(key, "<unset>"):
            return key
    return None


def describe_mismatch(rank: int, mine: Dict, zero: Dict) -> Optional[ConfigError | SplatInputError]:
    """The error for rank ``rank``'s identity ``mine`` against rank 0's
    ``zero`` (:func:`rank_identity`), or None when they agree."""
    whose = f"rank {rank}'s"
    key = _first_difference(mine["code"], zero["code"])
    if key is not None:
        if key == "version":
            what = f"splat {mine['code'].get(key, '<unset>')} against {zero['code'].get(key, '<unset>')}"
        elif key not in mine["code"] or key not in zero["code"]:
            what = f"{key} {'missing on rank ' + str(rank) if key not in mine['code'] else 'missing on rank 0'}"
        else:
            what = f"{key} differs"
        return SplatInputError(
            f"{whose} code differs from rank 0's ({what}): run every rank from the same splat checkout"
        )
    key = _first_difference(mine["config"], zero["config"])
    if key is not None:
        a, b = mine["config"].get(key, "<unset>"), zero["config"].get(key, "<unset>")
        return ConfigError(
            f"{whose} config differs from rank 0's at {key} ({a!r} against {b!r}): "
            "start every rank with the same config and overrides"
        )
    md, zd = mine["data"], zero["data"]
    if md["fingerprint"] != zd["fingerprint"]:
        where = f"data.path {md['path']} on rank {rank}, {zd['path']} on rank 0"
        for split in ("train", "test"):
            if len(md[split]) != len(zd[split]):
                what = f"{len(md[split])} {split} images against {len(zd[split])}"
                break
            names = [(a, b) for a, b in zip(md[split], zd[split]) if a != b]
            if names:
                what = f"{split} image {names[0][0]} where rank 0 has {names[0][1]}"
                break
        else:
            what = "the same image names, different pixels, masks, cameras or points"
        return SplatInputError(
            f"{whose} training data differ from rank 0's ({where}: {what}): give every rank the same scene"
        )
    return None


def check_same_run(group: Group, identity: Dict) -> None:
    """Gathers every rank's :func:`rank_identity` and raises, on every rank,
    the error for the first rank that differs from rank 0 (nothing with one
    process)."""
    if not group.distributed:
        return
    everyone: List[Dict] = all_gather_objects(identity, group)
    for rank in range(1, len(everyone)):
        error = describe_mismatch(rank, everyone[rank], everyone[0])
        if error is not None:
            raise error
