"""Test images must not leak into training (issue 27): split lists that
overlap, a frame listed twice, two COLMAP images of one name, one image in
both NeRF-synthetic json files.  Each is refused with a DataError naming the
file and the image."""

from __future__ import annotations

import json
from pathlib import Path

import fixtures_data as fx
import pytest
from test_transforms_json import write_transforms

from splat.data import DataError, load_scene


def _edit(path: Path, fn) -> None:
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


SPLITS = {
    "in both lists": (
        ["images/view_01.png", "images/view_02.png"],
        ["images/view_02.png"],
        r"'images/view_02.png' is named twice, in 'train_filenames' and 'test_filenames'",
    ),
    "in both lists, spelled differently": (
        ["images/view_01.png", "./images/view_02.png"],
        ["images/view_02.png"],
        r"'images/view_02.png' is named twice, in 'train_filenames' and ",
    ),
    "twice in the test list": (
        ["images/view_01.png"],
        ["images/view_02.png", "images/view_02.png"],
        r"'images/view_02.png' is named twice, in 'test_filenames'",
    ),
}


@pytest.mark.parametrize("case", list(SPLITS))
def test_overlapping_split_lists_are_refused(tmp_path, case):
    train, test, words = SPLITS[case]
    root = write_transforms(tmp_path / "s", fx.make_scene(n_views=4), train_filenames=train, test_filenames=test)
    with pytest.raises(DataError, match=f"transforms.json: {words}"):
        load_scene(root)


def _duplicate_frame(root: Path, file_path=None, shift: float = 0.0) -> None:
    def dup(meta):
        fr = json.loads(json.dumps(meta["frames"][0]))
        fr["transform_matrix"][0][3] += shift  # another pose for the same image
        if file_path is not None:
            fr["file_path"] = file_path
        meta["frames"].append(fr)

    _edit(root / "transforms.json", dup)


@pytest.mark.parametrize("variant", ["identical", "other pose", "spelled without extension"])
def test_duplicated_frame_is_refused(tmp_path, variant):
    """With test_every=2 one copy of view_03 would be a train view, the other a test view."""
    root = write_transforms(tmp_path / "s", fx.make_scene(n_views=4))  # file order: view_03 first
    _duplicate_frame(
        root,
        file_path="images/view_03" if variant == "spelled without extension" else None,
        shift=0.5 if variant == "other pose" else 0.0,
    )
    with pytest.raises(
        DataError,
        match=r"transforms.json: frames\[\d\] and frames\[\d\] both use image "
        r"'images/view_03(\.png)?' \(a duplicated frame",
    ):
        load_scene(root, test_every=2)


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_colmap_images_with_the_same_name_are_refused(tmp_path, fmt):
    truth = fx.make_scene(n_views=5)
    truth.views[3].name = truth.views[1].name  # two poses for view_01.png
    root = fx.write_colmap_scene(tmp_path / "s", truth, fmt)
    ids = sorted((truth.views[1].id, truth.views[3].id))
    name = "images.txt" if fmt == "text" else "images.bin"
    with pytest.raises(DataError, match=rf"{name}: image ids {ids[0]} and {ids[1]} are both named 'view_01.png'"):
        load_scene(root, test_every=2)


def test_nerf_image_in_train_and_test_json_is_refused(tmp_path):
    truth = fx.make_scene(n_views=4)
    root = fx.write_nerf_scene(tmp_path / "s", truth, n_test=2)
    _edit(root / "transforms_test.json", lambda m: m["frames"][1].update(file_path="images/view_00.png"))
    with pytest.raises(
        DataError,
        match=r"transforms_test.json: frames\[1\] and transforms_train.json frames\[0\] "
        r"both use image 'images/view_00.png'",
    ):
        load_scene(root)
    load_scene(fx.write_nerf_scene(tmp_path / "ok", truth, n_test=2))  # a clean scene loads
