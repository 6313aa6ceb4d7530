"""render.py and view.py on a run folder show the newest model and say its
step: ``point_cloud.ply`` of a finished run, but the newest complete
checkpoint of a resumed run that was stopped before it finished (its
``point_cloud.ply`` is the older model of the run before the resume)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from test_train import make_tiny_scene, tiny_config  # tests/ is on sys.path under pytest

from splat.trained_run import load_run
from splat.viewer.load import load_for_viewer


class Stop(Exception):
    """Ends a run as a kill would, after a checkpoint."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(finished run, a copy resumed to 40 steps and stopped at 30)."""
    from splat.trainer import Trainer

    scene = make_tiny_scene(tmp_path_factory.mktemp("scene"))
    finished = tmp_path_factory.mktemp("finished") / "run"
    Trainer(tiny_config(scene, 20, ["checkpoint.every=10"]), finished).train()
    stopped = finished.parent / "stopped"
    shutil.copytree(finished, stopped)

    def stop(trainer, step, terms):
        if step == 30:
            raise Stop()

    with pytest.raises(Stop):
        Trainer(tiny_config(scene, 40, ["checkpoint.every=10"]), stopped, resume=True, callbacks=[stop]).train()
    return finished, stopped


def _shown(load, out: Path) -> str:
    log = io.StringIO()
    load(out, log)
    lines = log.getvalue().splitlines()
    assert len([ln for ln in lines if ln.startswith("model: ")]) == 1, lines
    return next(ln for ln in lines if ln.startswith("model: "))


RENDER = lambda out, log: load_run(out, log=log)  # noqa: E731
VIEW = lambda out, log: load_for_viewer(out, log=log)  # noqa: E731


@pytest.mark.parametrize("load", [RENDER, VIEW], ids=["render", "view"])
def test_a_finished_run_shows_its_ply_and_step(runs, load):
    finished, _ = runs
    assert _shown(load, finished) == f"model: step 20 from {finished / 'point_cloud.ply'}"


@pytest.mark.parametrize("load", [RENDER, VIEW], ids=["render", "view"])
def test_a_stopped_resumed_run_shows_its_newest_checkpoint(runs, load):
    from splat.checkpoints import load_latest_checkpoint

    _, stopped = runs
    assert (stopped / "point_cloud.ply").is_file()  # step 20's, from before the resume
    line = _shown(load, stopped)
    assert line.startswith("model: step 30 of 40 from ") and "ckpt_0000030_" in line and "unfinished" in line, line
    model = load_run(stopped, log=io.StringIO())[0]
    assert model.num_gaussians == len(load_latest_checkpoint(stopped)["ids"])
    assert load_for_viewer(stopped, log=io.StringIO()).source.endswith(".pt")


def test_past_a_garbled_newest_checkpoint_the_ply_is_shown(runs, tmp_path, capsys):
    """The checkpoint before a garbled one may be older than the PLY (here
    step 20, the PLY's own step): the PLY is shown, not an older model."""
    _, stopped = runs
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    (newest,) = run.glob("checkpoints/ckpt_0000030_*.pt")
    newest.write_bytes(b"x" * 100)
    line = _shown(RENDER, run)
    assert line == f"model: {run / 'point_cloud.ply'} (step not known)", line
    assert str(newest) in capsys.readouterr().err  # the skipped checkpoint is named
