"""Run identity and checkpoints (splat/run_folder.py, splat/checkpoints.py): a folder holds one run,
resume takes only that run's checkpoints, and the keep policy never lets a
foreign or corrupt file push a valid checkpoint out."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_train import make_tiny_scene, tiny_config  # tests/ is on sys.path under pytest

from splat.checkpoints import load_latest_checkpoint, prune as prune_checkpoints
from splat.errors import RunStateError
from splat.run_folder import (
    RESUMABLE_KEYS,
    checkpoint_path,
    checkpoint_step,
    list_checkpoints,
)
from splat.trainer import Trainer


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return make_tiny_scene(tmp_path_factory.mktemp("scene"), n_views=6)


class Stop(Exception):
    """Raised by a step callback: the in-process stand-in for a kill."""


def _stop_at(n):
    def hook(trainer, step, terms):
        if step == n:
            raise Stop

    return hook


def _cfg(scene, iterations, *extra):
    return tiny_config(scene, iterations, ["checkpoint.every=1", "checkpoint.keep=2", *extra])


def _steps(out, run_id=None):
    return [checkpoint_step(p) for p in list_checkpoints(out, run_id)]


def test_new_run_in_a_folder_of_another_run_is_refused(scene, tmp_path):
    """Before: a shorter second run in the folder of a longer one had each new
    checkpoint deleted at once (the old run's higher steps ranked newest)."""
    out = tmp_path / "run"
    Trainer(_cfg(scene, 6), out).train()
    with pytest.raises(RunStateError, match=r"holds another run .*loss.dist_lambda.*--overwrite"):
        Trainer(_cfg(scene, 3, "loss.dist_lambda=7"), out)
    with pytest.raises(RunStateError, match="this run already.*--resume"):
        Trainer(_cfg(scene, 6), out)
    t = Trainer(_cfg(scene, 3, "loss.dist_lambda=7"), out, overwrite=True)
    t.train()
    assert _steps(out) == [3, 2]  # the new run's newest two, nothing of the old run
    assert load_latest_checkpoint(out)["run_id"] == t.run_id


def test_resume_refuses_another_runs_checkpoint(scene, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Stop):
        Trainer(_cfg(scene, 6), out, callbacks=[_stop_at(3)]).train()
    for change in ("seed=1", "loss.dist_lambda=7", "train.lr.means=1e-3", "render.far=50"):
        with pytest.raises(RunStateError, match="another run.*" + change.split("=")[0].replace(".", r"\.")):
            Trainer(_cfg(scene, 6, change), out, resume=True)
    # other data, same config: refused as well
    other = make_tiny_scene(tmp_path / "other", n_views=7)
    with pytest.raises(RunStateError, match="training data"):
        Trainer(_cfg(other, 6), out, resume=True)
    assert _steps(out) == [3, 2]  # nothing was touched


def test_resume_allows_the_declared_changes(scene, tmp_path):
    """train.iterations, checkpoint.*, log.*, device, render.backend/depth, eval.*, distributed.* and
    the data's location may change on resume (splat.run_folder.RESUMABLE_KEYS)."""
    assert set(RESUMABLE_KEYS) == {
        "train.iterations",
        "checkpoint",
        "log",
        "device",
        "render.backend",
        "render.depth",
        "eval",
        "data.path",
        "distributed",
    }
    out = tmp_path / "run"
    Trainer(_cfg(scene, 3), out).train()
    moved = tmp_path / "moved_scene"
    shutil.copytree(scene, moved)
    t = Trainer(
        _cfg(
            moved,
            5,
            "checkpoint.keep=3",
            "log.every=2",
            "render.depth=median",
            "render.backend=torch",
            "eval.masked=false",
        ),
        out,
        resume=True,
    )
    assert t.step == 3
    m = t.train()
    assert m["iterations"] == 5 and _steps(out) == [5, 4, 3]
    with pytest.raises(RunStateError, match="step 5, beyond train.iterations=4"):
        Trainer(_cfg(scene, 4), out, resume=True)


def test_corrupt_newer_checkpoints_never_delete_valid_ones(scene, tmp_path):
    """Before: with the highest-numbered checkpoints corrupt, each valid new one
    was deleted as soon as it was written (a kill then lost every step)."""
    out = tmp_path / "run"
    t = Trainer(_cfg(scene, 8), out, callbacks=[_stop_at(4)])
    with pytest.raises(Stop):
        t.train()
    good = checkpoint_path(out, 4, t.run_id).read_bytes()
    for step in (9, 10):
        checkpoint_path(out, step, t.run_id).write_bytes(good[: len(good) // 3])
    seen = []

    def newest_is_current(trainer, step, terms):
        seen.append((step, load_latest_checkpoint(out, trainer.run_id)["step"]))

    t = Trainer(_cfg(scene, 8), out, resume=True, callbacks=[newest_is_current])
    assert t.step == 4
    t.train()
    assert seen == [(s, s) for s in range(5, 9)]
    assert _steps(out) == [8, 7]
    assert (
        sorted(p.name for p in (out / "checkpoints").glob("*.corrupt"))
        == [checkpoint_path(out, s, t.run_id).name + ".corrupt" for s in (10, 9)][::-1]
    )


def test_keep_policy_touches_only_older_checkpoints_of_the_same_run(tmp_path):
    out = tmp_path
    for run, steps in (("aaaa", [1, 2, 3, 4, 9]), ("bbbb", [5, 6, 7])):
        for s in steps:
            p = checkpoint_path(out, s, run)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x")
    removed = prune_checkpoints(out, "aaaa", step=4, keep=2)
    assert sorted(checkpoint_step(p) for p in removed) == [1, 2]
    assert _steps(out, "aaaa") == [9, 4, 3] and _steps(out, "bbbb") == [7, 6, 5]


def test_temp_files_of_a_killed_writer_are_removed_at_start(scene, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    stale = [out / "checkpoints" / ".ckpt_0000003_0123456789abcdef.pt.tmp4242", out / ".config.yaml.tmp17"]
    for p in stale:
        p.write_bytes(b"partial")
    keep = out / "notes.txt"  # not ours: never touched
    keep.write_text("mine")
    Trainer(_cfg(scene, 1), out).train()
    assert not any(p.exists() for p in stale) and keep.read_text() == "mine"


def test_one_trainer_per_folder(scene, tmp_path):
    out = tmp_path / "run"
    first = Trainer(_cfg(scene, 2), out)
    with pytest.raises(RunStateError, match="another training process"):
        Trainer(_cfg(scene, 2), out, overwrite=True)
    first.train()  # releases the folder
    Trainer(_cfg(scene, 2), out, resume=True).train()


def test_checkpoint_without_parameters_is_skipped(scene, tmp_path):
    out = tmp_path / "run"
    t = Trainer(_cfg(scene, 2), out)
    t.train()
    p = checkpoint_path(out, 3, t.run_id)
    torch.save({"step": 3, "run_id": t.run_id}, p)
    assert load_latest_checkpoint(out, t.run_id)["step"] == 2
