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
from splat.training.resolution import CoarseViews, coarse_frame, resolution_factor

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


def test_coarse_views_are_made_once_and_dropped_at_full_resolution():
    scene = load_scene(SAMPLE)
    frames = scene.train
    views = CoarseViews(scene, {"coarse_factor": 2, "coarse_until": 5})
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
        (
            ["train.coarse_factor=2", "train.coarse_until=500"]
            + ["loss.multiview.enabled=true", "loss.multiview.start=100"],
            "loss.multiview.start \\(100\\) must not come before train.coarse_until \\(500\\)",
        ),
    ],
)
def test_bad_schedules_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_run_renders_coarse_then_full(tmp_path, monkeypatch):
    from splat.trainer import Trainer

    cfg = load_config(
        "fast",
        [f"data.path={SAMPLE}", "train.iterations=6", "train.coarse_factor=4", "train.coarse_until=5"]
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
