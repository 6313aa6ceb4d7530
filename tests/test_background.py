"""data.background: auto (splat/data/background.py): the backdrop colour
of the training photos, else white; the run's config.yaml holds the choice."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from test_train import tiny_config, tiny_scene  # noqa: F401 (fixture)

from splat.config import load_config
from splat.data.background import AUTO_MIN_SHARE, WHITE, backdrop_colour, resolve_background
from splat.data.types import Frame, SceneData
from splat.errors import ConfigError
from splat.trainer import Trainer

SKY = (237, 243, 255)


def _frame(share: float, colour=SKY, size=64, seed=0, alpha=False, loss_mask=None) -> Frame:
    """Random RGB noise, with the first `share` of the pixels (row-major) set to `colour`."""
    g = torch.Generator().manual_seed(seed)
    image = torch.rand(size, size, 3, generator=g)
    flat = image.view(-1, 3)
    flat[: int(share * size * size)] = torch.tensor(colour, dtype=torch.float32) / 255
    return Frame(
        stem=f"f{seed}",
        image_path=Path(f"f{seed}.png"),
        image=image,
        mask=torch.ones(size, size) if alpha else None,
        viewmat=torch.eye(4),
        K=torch.eye(3),
        width=size,
        height=size,
        loss_mask=loss_mask,
    )


def _scene(frames) -> SceneData:
    return SceneData(train=list(frames), test=[], points=None, point_colors=None, layout="nerf")


def _data_cfg(**kw) -> dict:
    return dict(load_config()["data"], **kw)


def test_a_backdrop_covering_enough_pixels_is_the_background():
    scene = _scene([_frame(0.3, seed=0), _frame(0.2, seed=1)])
    colour, share = backdrop_colour(scene.train)
    assert [round(c * 255) for c in colour] == list(SKY)
    assert share == pytest.approx(0.25, abs=0.02)  # the grid samples every pixel of a 64 x 64 image
    assert resolve_background(_data_cfg(background="auto"), scene) == colour


def test_a_rare_colour_is_not_a_backdrop_and_white_is_taken():
    scene = _scene([_frame(AUTO_MIN_SHARE / 2, seed=0)])
    assert backdrop_colour(scene.train)[1] < AUTO_MIN_SHARE
    assert resolve_background(_data_cfg(background="auto"), scene) == WHITE


def test_pixels_the_loss_leaves_out_are_not_counted():
    """A backdrop under data.masks=ignore's zero weights is no backdrop the render must show."""
    size = 64
    mask = torch.ones(size, size)
    mask[: size // 2] = 0  # the first half of the rows: where the colour is
    scene = _scene([_frame(0.3, size=size, loss_mask=mask)])
    assert resolve_background(_data_cfg(background="auto"), scene) == WHITE
    assert backdrop_colour(scene.train)[1] < AUTO_MIN_SHARE


def test_where_the_loader_composites_white_is_taken_without_looking():
    rgba = _scene([_frame(0.5, alpha=True)])
    assert resolve_background(_data_cfg(background="auto"), rgba) == WHITE
    masked = _scene([_frame(0.5)])
    assert resolve_background(_data_cfg(background="auto", masks="background"), masked) == WHITE
    # an explicit colour is kept whatever the photos show
    assert resolve_background(_data_cfg(background=[0.1, 0.2, 0.3]), masked) == [0.1, 0.2, 0.3]


def test_large_images_are_read_on_a_grid():
    frame = _frame(0.4, size=700)  # 490,000 pixels: a stride of 3 in each direction
    colour, share = backdrop_colour([frame])
    assert [round(c * 255) for c in colour] == list(SKY) and share == pytest.approx(0.4, abs=0.01)


@pytest.mark.parametrize(
    "value, message",
    [
        ("white", "data.background: expected one of 'auto' or a list of float, got 'white'"),
        ("[0.5, 0.5]", "data.background: expected 3 values, got 2"),
        ("[0.5, 0.5, 2]", "data.background: must be >= 0.0 and <= 1.0, got 2.0"),
    ],
)
def test_bad_backgrounds_are_one_line_errors_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as err:
        load_config(overrides=[f"data.background={value}"])
    assert "\n" not in str(err.value)


def test_training_writes_the_chosen_colour_and_renders_over_it(tiny_scene, tmp_path):  # noqa: F811
    """The tiny scene's RGBA photos flattened over a blue backdrop: auto picks it, config.yaml holds it,
    a resumed run keeps its run id, and the render's empty pixels are that blue."""
    scene = tmp_path / "scene"
    shutil.copytree(tiny_scene, scene)
    blue = np.array([40, 60, 200], dtype=np.float32)
    for png in sorted((scene / "images").glob("*.png")):
        rgba = np.asarray(Image.open(png), dtype=np.float32)
        a = rgba[..., 3:] / 255
        Image.fromarray((rgba[..., :3] * a + blue * (1 - a) + 0.5).astype(np.uint8), "RGB").save(png)
    cfg = tiny_config(scene, 4, extra=["data.background=auto"])
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        trainer.train()
    finally:
        trainer.close()
    want = (blue / 255).tolist()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["background"]
    assert saved == pytest.approx(want, abs=1e-6)
    assert trainer.background.tolist() == pytest.approx(want, abs=1e-6)
    resumed = Trainer(cfg, tmp_path / "run", resume=True)
    try:
        assert resumed.run_id == trainer.run_id
        out = resumed.render(resumed.scene.test[0])
        empty = out.alpha < 1e-4  # [H, W]: the tiny scene's planes leave corners empty
        assert empty.any()
        assert torch.allclose(out.rgb[empty], torch.tensor(want), atol=1e-3)
    finally:
        resumed.close()


def test_readers_of_an_unresolved_config_render_over_white():
    """A config no training resolved (the viewer given a PLY and the default config): white, photos unread."""
    from splat.data.background import configured_background

    assert configured_background(_data_cfg(background="auto")) == WHITE
    assert configured_background(_data_cfg(background=[0.2, 0.4, 0.6])) == [0.2, 0.4, 0.6]
