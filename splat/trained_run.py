"""A finished (or interrupted) training run read back for rendering and
meshing: :func:`load_run`, and which model of a run folder to show:
:func:`newest_model`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

from .errors import SplatInputError

if TYPE_CHECKING:
    from .model import GaussianModel


@dataclass
class RunModel:
    """A run folder's model and where it came from."""

    model: GaussianModel
    source: str  # the file: point_cloud.ply, a checkpoint file or a manifest
    step: Optional[int]  # the training step it holds (None: not known)
    iterations: Optional[int]  # the run's train.iterations (None: not known)
    unfinished: bool  # a checkpoint of a run that has not reached train.iterations

    def describe(self) -> str:
        """One line: the step shown and its file."""
        if self.step is None:
            return f"{self.source} (step not known)"
        of = f" of {self.iterations}" if self.iterations is not None and self.unfinished else ""
        why = " (the newest complete checkpoint: the run is unfinished)" if self.unfinished else ""
        return f"step {self.step}{of} from {self.source}{why}"


def _iterations(model_dir: Path) -> Optional[int]:
    """``train.iterations`` of the run's ``config.yaml`` (rewritten at the
    start of every run and resume), or None if it cannot be read."""
    import yaml

    try:
        value = yaml.safe_load((model_dir / "config.yaml").read_text())["train"]["iterations"]
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def newest_model(model_dir: Path) -> Optional[RunModel]:
    """The model a run folder shows, or None if it holds neither
    ``point_cloud.ply`` nor a readable checkpoint of its run.

    ``point_cloud.ply`` is written once, when a run reaches
    ``train.iterations``, after the checkpoint of that step.  A resumed run
    (with more iterations) rewrites ``config.yaml`` at its start and leaves
    the older ``point_cloud.ply`` until it finishes: so a run whose newest
    complete checkpoint is below ``train.iterations`` is unfinished, and
    that checkpoint (never older than the PLY) is the newest model.  File
    times and ``metrics.json`` are not consulted: copies and clocks change
    the one, and a kill between the PLY and the metrics the other."""
    from .checkpoints import load_latest_checkpoint, newest_checkpoint_step
    from .model import GaussianModel
    from .ply import load_ply
    from .run_folder import read_run_file

    model_dir = Path(model_dir)
    run = read_run_file(model_dir)
    run_id = run["run_id"] if run and run["run_id"] != "<unreadable>" else None
    iterations = _iterations(model_dir)
    newest = newest_checkpoint_step(model_dir, run_id)
    ply = model_dir / "point_cloud.ply"
    unfinished = newest is not None and iterations is not None and newest < iterations
    if not ply.is_file() or unfinished:
        ckpt = load_latest_checkpoint(model_dir, run_id)
        # Past an unreadable newest checkpoint, an older one may be older
        # than the PLY too: then the PLY is the newer of the two we know.
        if ckpt is not None and (not ply.is_file() or int(ckpt["step"]) == newest):
            step = int(ckpt["step"])
            model = GaussianModel(ckpt["params"], ckpt["sh_degree"])
            return RunModel(model, ckpt["path"], step, iterations, iterations is None or step < iterations)
        if not ply.is_file():
            return None
    step = iterations if newest is not None and newest == iterations else None
    return RunModel(load_ply(ply), str(ply), step, iterations, False)


def load_run(model_dir, data: Optional[str] = None, overrides=(), log: Optional[TextIO] = None):
    """(model, cfg, scene) of a training output folder.

    The model comes from ``point_cloud.ply`` (written at the end of training)
    or, for an unfinished run, from the newest complete checkpoint
    (:func:`newest_model`); one line ``model: step S ...`` on ``log`` says
    which (default: stderr).  ``data`` replaces the data folder recorded in ``config.yaml``.
    A model with no surfels is a SplatInputError naming its file.  The train
    cameras have the run's optimised poses when it has them
    (:func:`run_scene`).
    """
    from .config import load_config

    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.yaml"
    if not cfg_path.is_file():
        raise SplatInputError(f"{cfg_path}: not found (is {model_dir} a training output folder?)")
    cfg = load_config(str(cfg_path), overrides)
    if data is not None:
        cfg["data"]["path"] = str(data)
    found = newest_model(model_dir)
    if found is None:
        raise SplatInputError(f"{model_dir}: neither point_cloud.ply nor a readable checkpoint of this run")
    model, source = found.model, found.source
    if model.num_gaussians == 0:
        # An error, not a warning: every image would be the background alone
        # and a mesh empty, which is no use and easy to mistake for a result.
        raise SplatInputError(f"{source}: the model has no surfels: nothing to render")
    print(f"model: {found.describe()}", file=log or sys.stderr)  # sys.stderr now, not at import
    return model, cfg, run_scene(model_dir, cfg)


def run_scene(model_dir, cfg: dict):
    """The data of the run in ``model_dir`` as ``cfg["data"]`` names it, its
    train cameras posed as the run optimised them (``OUT/poses.json``,
    ``train.pose_opt``) when it has that file; test cameras as given."""
    from .data import load_scene_from_config
    from .pose_opt import POSES_FILE, read_poses

    scene = load_scene_from_config(cfg["data"])
    poses = Path(model_dir) / POSES_FILE
    if poses.is_file():
        read_poses(poses, scene.train, cfg["data"]["path"])
    return scene
