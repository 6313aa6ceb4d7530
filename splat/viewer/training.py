"""``train.py --viewer``: train with the live viewer attached through the trainer's step hook."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from .camera import start_view_from_camera
from .load import model_extent
from .optional_viser import require_viser


def train_with_viewer(
    cfg: dict,
    out: str | Path,
    resume: bool = False,
    overwrite: bool = False,
    port: int = 8080,
    host: str = "127.0.0.1",
    keep_serving: bool = True,
    log: TextIO = sys.stderr,
) -> int:
    """Train like ``Trainer(cfg, out).train()`` while serving the viewer (see
    :class:`splat.viewer.server.TrainingView`); afterwards keep showing the
    final model until Ctrl+C if ``keep_serving``."""
    require_viser()  # before the (slow) data loading
    from ..model import GaussianModel
    from ..trainer import Trainer
    from .network import check_port
    from .server import TrainingView

    check_port(port)

    trainer = Trainer(cfg, Path(out), resume=resume, overwrite=overwrite)
    try:
        frames = trainer.scene.test or trainer.scene.train
        f = frames[0]
        center, _ = model_extent(trainer.model)
        start = start_view_from_camera(f.viewmat.double().numpy(), f.K.double().numpy(), f.height, center)
        r = cfg["render"]
        view = TrainingView(
            GaussianModel(trainer.model.raw_state(), trainer.model.sh_degree),
            start,
            backend=r["backend"],
            near=r["near"],
            far=r["far"],
            background=trainer.cfg["data"]["background"],  # auto resolved by the trainer
            host=host,
            port=port,
            scene_radius=trainer.scene_radius,
            title=f"splat: training {Path(out).name}",
            log=log,
        )
    except BaseException:
        trainer.close()
        raise
    print(f"viewer: {view.url}  (live training view; pause from the page)", file=log, flush=True)
    trainer.callbacks.append(view.callback)
    try:
        trainer.train()
        view.set_model(GaussianModel(trainer.model.raw_state(), trainer.model.sh_degree))
        view.finished(trainer.step)
        if keep_serving:
            print(
                f"training done; the viewer still shows the result at {view.url} (Ctrl+C to stop)", file=log, flush=True
            )
            view.serve_until_interrupted()
    finally:
        view.close()
    return 0
