"""What ``view.py --model PATH`` shows: a model, its render settings and where the camera starts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, TextIO, Tuple

import numpy as np

from ..errors import SplatInputError
from .camera import StartView, start_view_from_camera, start_view_looking_at

if TYPE_CHECKING:
    from ..model import GaussianModel


@dataclass
class ViewerInput:
    model: object  # splat.model.GaussianModel
    start: StartView
    near: float = 0.2
    far: float = 100.0
    background: Sequence[float] = (1.0, 1.0, 1.0)
    scene_radius: Optional[float] = None
    source: str = ""  # the file the model came from


def model_extent(model: GaussianModel) -> Tuple[np.ndarray, float]:
    """(centre [3], radius): the median of the surfel centres and the 90th
    percentile of their distances from it (robust to a few far floaters)."""
    means = model.means.detach().cpu().double().numpy()
    if len(means) == 0:
        return np.zeros(3), 1.0
    center = np.median(means, axis=0)
    radius = float(np.percentile(np.linalg.norm(means - center, axis=1), 90))
    return center, radius if radius > 0 else 1.0


def load_model_file(path: Path, log: Optional[TextIO] = None) -> Tuple[GaussianModel, str]:
    """(model, source) of a PLY file or a training output folder: its
    ``point_cloud.ply``, or the newest complete checkpoint of an unfinished
    run (:func:`splat.trained_run.newest_model`); for a folder, one line
    ``model: step S ...`` on ``log`` says which."""
    from ..ply import load_ply
    from ..trained_run import newest_model

    if path.is_file():
        if path.suffix.lower() != ".ply":
            raise SplatInputError(f"{path}: not a .ply file or a training output folder")
        return load_ply(path), str(path)
    found = newest_model(path)
    if found is None:
        raise SplatInputError(
            f"{path}: holds neither point_cloud.ply nor a readable checkpoint (is it a training output folder?)"
        )
    if log is not None:
        print(f"model: {found.describe()}", file=log)
    return found.model, found.source


def start_from_data(
    cfg: dict, target: Sequence[float] | np.ndarray, log: TextIO = sys.stderr, run: Optional[Path] = None
) -> Optional[Tuple[StartView, float]]:
    """(start, scene radius) at the first test camera (else the first train
    camera, with the optimised pose of the run folder ``run`` if it has one)
    of the config's data, or None if the data do not load."""
    from ..data import load_scene_from_config
    from ..trained_run import run_scene

    try:
        scene = run_scene(run, cfg) if run is not None else load_scene_from_config(cfg["data"])
    except (SplatInputError, OSError, ValueError) as e:
        print(f"warning: cannot load the data of the run ({e}); starting from a camera looking at the model", file=log)
        return None
    frames = scene.test or scene.train
    if not frames:
        return None
    f = frames[0]
    return start_view_from_camera(f.viewmat.double().numpy(), f.K.double().numpy(), f.height, target), float(
        scene.scene_radius()
    )


def load_for_viewer(
    path: str | Path, data: Optional[str] = None, root: Optional[Path] = None, log: Optional[TextIO] = None
) -> ViewerInput:
    """Load a PLY file or a training output folder (``OUT/config.yaml`` gives
    near/far, background and the data whose first test camera is the start).
    ``data`` (a scene folder) replaces the config's data, and gives a model
    without a config its start camera (with the default near/far and
    background).  A relative data path that does not exist is looked up under
    ``root`` too (as train.py does for the bundled sample)."""
    from ..config import load_config
    from ..data.background import configured_background

    log = log or sys.stderr  # the current one (pytest's capture replaces it), not the one at import
    path = Path(path)
    if not path.exists():
        raise SplatInputError(f"{path}: no such file or folder")
    if data is not None and not Path(data).exists() and not (root is not None and (Path(root) / data).exists()):
        raise SplatInputError(f"{data}: no such data folder (--data)")
    model, source = load_model_file(path, log)
    center, radius = model_extent(model)
    inp = ViewerInput(model, start_view_looking_at(center, radius), source=source, scene_radius=radius)
    cfg_path = path / "config.yaml" if path.is_dir() else path.parent / "config.yaml"
    if cfg_path.is_file() or data is not None:
        cfg = load_config(str(cfg_path) if cfg_path.is_file() else None)
        if data is not None:
            cfg["data"]["path"] = str(data)
        d = Path(cfg["data"]["path"])
        if root is not None and not d.is_absolute() and not d.exists() and (Path(root) / d).exists():
            cfg["data"]["path"] = str(Path(root) / d)
        inp.near, inp.far = float(cfg["render"]["near"]), float(cfg["render"]["far"])
        inp.background = tuple(configured_background(cfg["data"]))
        found = start_from_data(cfg, center, log, cfg_path.parent if cfg_path.is_file() else None)
        if found is not None:
            inp.start, inp.scene_radius = found
    return inp
