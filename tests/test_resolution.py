"""Coarse-to-fine training (splat/training/resolution.py): the schedule of
factors, coarse views that are exactly the loader's own downscale, the
config's checks, and a run whose first steps render the coarse size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from splat.config import load_config
from splat.data import load_scene
from splat.errors import ConfigError
from splat.training.resolution import CoarseViews, coarse_frame, full_resolution_step, resolution_factor

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample_scene"


def test_the_factor_halves_in_equal_spans_until_full_resolution():
    factors = [resolution_factor(step, 4, 601) for step in range(1, 700)]
    assert factors[:300] == [4] * 300 and factors[300:600] == [2] * 300 and set(factors[600:]) == {1}
    assert [resolution_factor(s, 8, 10) for s in range(1, 11)] == [8, 8, 8, 4, 4, 4, 2, 2, 2, 1]
    assert {resolution_factor(s, 1, 500) for s in range(1, 600)} == {1}  # off
    assert {resolution_factor(s, 4, 0) for s in range(1, 10)} == {1}  # nothing before step 0


def test_a_coarse_view_is_the_loaders_own_downscale():
    full, half = load_scene(SAMPLE).train, load_scene(SAMPLE, downscale=2).train
    for a, b in zip(full, half):
        c = coarse_frame(a, 2)
        assert (c.width, c.height) == (b.width, b.height)
        assert torch.equal(c.image, b.image) and torch.equal(c.K, b.K)
        assert (c.mask is None) == (b.mask is None) and (c.mask is None or torch.allclose(c.mask, b.mask))
        assert torch.equal(c.viewmat, a.viewmat) and c.image_path == a.image_path
    assert coarse_frame(full[0], 1) is full[0]


def test_full_resolution_comes_at_the_latest_at_the_middle_of_the_run(capsys):
    assert full_resolution_step({"coarse_until": 750, "iterations": 1500}) == 750
    assert full_resolution_step({"coarse_until": 750, "iterations": 300}) == 150
    assert full_resolution_step({"coarse_until": 750, "iterations": 301}) == 151
    scene = load_scene(SAMPLE)
    short = CoarseViews(scene, {"coarse_factor": 4, "coarse_until": 750, "iterations": 300}, announce=True)
    assert short.at(149)[0].width == scene.train[0].width // 2 and short.at(150) is scene.train
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["train.coarse_until=750 is past the middle of train.iterations=300: full resolution from step 150"]
    CoarseViews(scene, {"coarse_factor": 4, "coarse_until": 750, "iterations": 1500}, announce=True)
    CoarseViews(scene, {"coarse_factor": 1, "coarse_until": 750, "iterations": 300}, announce=True)  # off: no note
    assert capsys.readouterr().err == ""


def test_coarse_views_are_made_once_and_dropped_at_full_resolution():
    scene = load_scene(SAMPLE)
    frames = scene.train
    views = CoarseViews(scene, {"coarse_factor": 2, "coarse_until": 5, "iterations": 100})
    first = views.at(1)
    assert len(first) == len(frames) and first[3] is views.at(2)[3] and first[3].width == frames[3].width // 2
    scene.train = frames[::-1]  # the scene's current views, as a caller may replace them
    assert views.at(2)[0] is views.at(1)[0] and views.at(2)[0].image_path == frames[-1].image_path
    assert views.at(5) is scene.train and not views._cache


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.coarse_factor=3"], "train.coarse_factor: must be a power of 2"),
        (["train.coarse_factor=0"], "train.coarse_factor"),
    ],
)
def test_bad_schedules_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_run_renders_coarse_then_full(tmp_path, monkeypatch):
    from splat.trainer import Trainer

    cfg = load_config(
        "fast",
        [f"data.path={SAMPLE}", "train.iterations=10", "train.coarse_factor=4", "train.coarse_until=5"]
        + ["log.progress=false", "checkpoint.every=0"],
    )
    trainer = Trainer(cfg, tmp_path / "run")
    sizes = []
    render = trainer.batch_step.rendering.backward

    def spy(model, cameras, *rest):
        sizes.append([(c.width, c.height) for c in cameras])
        return render(model, cameras, *rest)

    monkeypatch.setattr(trainer.batch_step.rendering, "backward", spy)
    for step in range(1, 7):
        trainer.train_step(step)
    full = trainer.scene.train[0]
    W, H = full.width, full.height
    assert sizes == [[(W // 4, H // 4)]] * 2 + [[(W // 2, H // 2)]] * 2 + [[(W, H)]] * 2
    trainer.close()


def test_multiview_terms_compare_the_coarse_photos_at_coarse_steps(tmp_path, monkeypatch):
    """A multi-view step below full resolution takes the photos and K of the
    step's coarse views, the size of its renders, and gives finite terms."""
    from splat.trainer import Trainer
    from splat.training.multiview_step import MultiViewTerms

    cfg = load_config(
        "fast",
        [f"data.path={SAMPLE}", "train.iterations=10", "train.coarse_factor=2", "train.coarse_until=5"]
        + ["loss.multiview.enabled=true", "loss.multiview.start=1", "loss.multiview.max_angle=90"]
        + ["log.progress=false", "checkpoint.every=0"],
    )
    trainer = Trainer(cfg, tmp_path / "run")
    sizes = []
    loss = MultiViewTerms.loss

    def spy(self, out, partner_out, frames, index, partner, *rest):
        H, W = out.depth.shape
        sizes.append((W, H, frames[index].width, frames[partner].height, partner_out.depth.shape[0]))
        return loss(self, out, partner_out, frames, index, partner, *rest)

    monkeypatch.setattr(MultiViewTerms, "loss", spy)
    full = trainer.scene.train[0]
    for step in (1, 5):
        terms = trainer.train_step(step)
        assert torch.isfinite(torch.tensor([terms["mv_geo"], terms["mv_ncc"]])).all()
    half = (full.width // 2, full.height // 2)
    assert sizes == [
        (*half, half[0], half[1], half[1]),
        (full.width, full.height, full.width, full.height, full.height),
    ]
    trainer.close()
