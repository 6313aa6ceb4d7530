"""A finished (or interrupted) training run read back for rendering and
meshing: :func:`load_run`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import SplatInputError


def load_run(model_dir, data: Optional[str] = None, overrides=()):
    """(model, cfg, scene) of a training output folder.

    The model comes from ``point_cloud.ply`` (written at the end of training)
    or, for an unfinished run, from the newest checkpoint.  ``data`` replaces
    the data folder recorded in ``config.yaml``.  A model with no surfels is
    a SplatInputError naming its file.
    """
    from .checkpoints import load_latest_checkpoint
    from .config import load_config
    from .data import load_scene_from_config
    from .model import GaussianModel
    from .ply import load_ply
    from .run_folder import read_run_file

    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.yaml"
    if not cfg_path.is_file():
        raise SplatInputError(f"{cfg_path}: not found (is {model_dir} a training output folder?)")
    cfg = load_config(str(cfg_path), overrides)
    if data is not None:
        cfg["data"]["path"] = str(data)
    ply = model_dir / "point_cloud.ply"
    if ply.is_file():
        model, source = load_ply(ply), ply
    else:
        run = read_run_file(model_dir)
        ckpt = load_latest_checkpoint(model_dir, run["run_id"] if run else None)
        if ckpt is None:
            raise SplatInputError(f"{model_dir}: neither point_cloud.ply nor a readable checkpoint of this run")
        model, source = GaussianModel(ckpt["params"], ckpt["sh_degree"]), ckpt["path"]
    if model.num_gaussians == 0:
        # An error, not a warning: every image would be the background alone
        # and a mesh empty, which is no use and easy to mistake for a result.
        raise SplatInputError(f"{source}: the model has no surfels: nothing to render")
    scene = load_scene_from_config(cfg["data"])
    return model, cfg, scene
