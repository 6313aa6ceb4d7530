"""The per-train-image parameters beside the model, each with its own
optimiser and held whole by every rank: the appearance correction
(``train.appearance``, :mod:`splat.appearance`, ``SparseAdam``) and the pose
correction (``train.pose_opt``, :mod:`splat.pose_opt`, :class:`splat.row_adam.RowAdam`); made, restored from a
checkpoint and written out here once."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from ..appearance import AffineAppearance, make_appearance, make_optimizer as appearance_optimizer
from ..errors import RunStateError
from ..pose_opt import POSES_FILE, PoseCorrection, make_pose_correction, poses_json
from ..row_adam import RowAdam
from ..run_folder import atomic_write_bytes


def make_corrections(
    cfg: Dict, scene, radius: float, device, optimizers: Dict
) -> Tuple[Optional[AffineAppearance], Optional[PoseCorrection]]:
    """(appearance, pose) corrections the config asks for (None: off); their
    optimisers are added to ``optimizers`` as ``"appearance"`` and ``"pose"``."""
    train = cfg["train"]
    appearance = make_appearance(train, len(scene.train), device)
    if appearance is not None:
        optimizers["appearance"] = appearance_optimizer(appearance, train["appearance_lr"])
    pose = make_pose_correction(train, scene.train, radius, device)
    if pose is not None:
        optimizers["pose"] = RowAdam(list(pose.parameters()), lr=train["pose_opt_lr"])
    return appearance, pose


def load_corrections(ckpt: Dict, appearance, pose) -> None:
    """Restores the corrections from checkpoint ``ckpt`` (their optimisers are
    restored with the others)."""
    for name, module in (("appearance", appearance), ("pose", pose)):
        if module is not None and ckpt.get(name) is None:
            raise RunStateError(f"{ckpt['path']}: holds no {name} corrections, which this config trains")
        if module is not None:
            module.load_state_dict(ckpt[name])


def save_poses(out_dir: Path, pose: Optional[PoseCorrection], scene, data_root) -> None:
    """``OUT/poses.json``: the optimised train poses (:func:`splat.pose_opt.poses_json`); nothing when off."""
    if pose is None:
        return
    viewmats = pose.viewmats(torch.stack([f.viewmat.double() for f in scene.train]))
    atomic_write_bytes(Path(out_dir) / POSES_FILE, poses_json(scene.train, viewmats, data_root))
