"""The nerfstudio / instant-ngp transforms.json loader (splat/data/transforms.py).

Scenes are written into tmp_path from the ground truth in fixtures_data.py.
(Lens distortion through this loader: tests/test_undistort.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fixtures_data as fx
from splat.data import DataError, load_scene
from test_data import check_frames_match_truth


def write_transforms(root: Path, truth: fx.Scene, per_frame: bool = False, masks: bool = False, **top) -> Path:
    """One transforms.json; intrinsics global (or per frame), OpenGL c2w."""
    root = Path(root)
    fx.write_images(root / "images", truth.views)
    cam = truth.cams[0]
    fxx, fyy, cx, cy = cam.fxfycxcy()
    intr = {"fl_x": fxx, "fl_y": fyy, "cx": cx, "cy": cy, "w": cam.width, "h": cam.height}
    frames = []
    for k, v in enumerate(truth.views):
        fr = {"file_path": f"images/{v.name}", "transform_matrix": fx.c2w_cv_to_gl(v.c2w_cv).tolist()}
        if per_frame:
            fr.update(intr)
        if masks:
            (root / "masks").mkdir(exist_ok=True)
            m = np.zeros((cam.height, cam.width), np.uint8)
            m[:, : cam.width // 2] = 255  # left half kept
            Image.fromarray(m).save(root / "masks" / v.name)
            fr["mask_path"] = f"masks/{v.name}"
        frames.append(fr)
    meta = dict(top)
    if not per_frame:
        meta.update(intr)
    meta["frames"] = frames[::-1]  # file order is not name order
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


@pytest.mark.parametrize("per_frame", [False, True])
def test_poses_and_intrinsics_match_truth(tmp_path, per_frame):
    truth = fx.make_scene(n_views=10, params=[14.0, 15.0, 7.5, 6.5])
    scene = load_scene(write_transforms(tmp_path / "s", truth, per_frame=per_frame))
    assert scene.layout == "transforms" and scene.points is None
    check_frames_match_truth(scene, truth)
    # every 8th frame of the name-sorted list is held out: view_00 and view_08
    assert [f.stem for f in scene.test] == ["view_00", "view_08"]
    assert len(scene.train) == 8
    d = load_scene(tmp_path / "s", downscale=2)
    check_frames_match_truth(d, truth, downscale=2)


def test_explicit_split_lists(tmp_path):
    truth = fx.make_scene(n_views=5)
    root = write_transforms(tmp_path / "s", truth, train_filenames=["images/view_01.png", "./images/view_02.png"],
                            test_filenames=["images/view_04.png"])
    s = load_scene(root)
    assert [f.stem for f in s.train] == ["view_01", "view_02"] and [f.stem for f in s.test] == ["view_04"]
    root = write_transforms(tmp_path / "v", truth, train_filenames=["images/view_00.png"],
                            val_filenames=["images/view_03.png"])
    assert [f.stem for f in load_scene(root).test] == ["view_03"]


def test_masks_background_ignore_none(tmp_path):
    truth = fx.make_scene(n_views=3, width=16, height=12)
    root = write_transforms(tmp_path / "s", truth, masks=True)
    off = load_scene(root, test_every=0)  # masks="none"
    bg = load_scene(root, test_every=0, masks="background", background=(0.0, 1.0, 0.0))
    ign = load_scene(root, test_every=0, masks="ignore")
    for a, b, c in zip(off.train, bg.train, ign.train):
        assert a.mask is None and a.loss_mask is None
        # background: right half becomes the background colour; the mask is the alpha
        assert torch.allclose(b.image[:, 8:], torch.tensor([0.0, 1.0, 0.0]).expand(12, 8, 3))
        assert torch.equal(b.image[:, :8], a.image[:, :8])
        assert torch.equal(b.mask, (torch.arange(16) < 8).float().expand(12, 16))
        assert b.loss_mask is None
        # ignore: image untouched, loss_mask set
        assert torch.equal(c.image, a.image) and c.mask is None
        assert torch.equal(c.loss_mask, b.mask)
    # masks are area-averaged with the image
    d = load_scene(root, test_every=0, masks="ignore", downscale=4).train[0]
    assert d.loss_mask.shape == (3, 4) and torch.equal(d.loss_mask[0], torch.tensor([1.0, 1.0, 0.0, 0.0]))


def test_ply_file_path_points(tmp_path):
    from plyfile import PlyData, PlyElement

    truth = fx.make_scene(n_views=3)
    root = write_transforms(tmp_path / "s", truth, ply_file_path="points3D.ply")
    v = np.array([tuple(p) + tuple(c) for p, c in zip(truth.xyz, truth.rgb)],
                 dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    PlyData([PlyElement.describe(v, "vertex")]).write(str(root / "points3D.ply"))
    s = load_scene(root)
    np.testing.assert_allclose(s.points.numpy(), truth.xyz, atol=1e-6)
    np.testing.assert_allclose(s.point_colors.numpy(), truth.rgb / 255.0, atol=1e-6)


def test_layout_detection_order(tmp_path):
    truth = fx.make_scene(n_views=3)
    root = write_transforms(tmp_path / "s", truth)
    fx.write_nerf_scene(root, truth, n_test=1)  # transforms_train.json too
    assert load_scene(root).layout == "transforms"
    assert load_scene(root, layout="nerf").layout == "nerf"
    fx.write_colmap_scene(root, truth)
    assert load_scene(root).layout == "colmap"
    assert load_scene(root, layout="transforms").layout == "transforms"


def _edit(root: Path, fn):
    p = root / "transforms.json"
    meta = json.loads(p.read_text())
    fn(meta)
    p.write_text(json.dumps(meta))


BAD = {
    "unknown camera_model": (lambda m: m.update(camera_model="EQUIRECTANGULAR"), "EQUIRECTANGULAR"),
    "k4 in OPENCV": (lambda m: m.update(camera_model="OPENCV", k1=0.1, k4=0.01), "k4"),
    "pinhole with distortion": (lambda m: m.update(camera_model="PINHOLE", k1=0.1), "k1"),
    "size mismatch": (lambda m: m.update(w=99), "size mismatch"),
    "no focal": (lambda m: [m.pop(k) for k in ("fl_x", "fl_y")], "fl_x"),
    "split name unknown": (lambda m: m.update(train_filenames=["images/nope.png"]), "nope.png"),
    "missing mask": (lambda m: m["frames"][0].update(mask_path="masks/none.png"), "none.png"),
    "bad matrix": (lambda m: m["frames"][0].update(transform_matrix=[[1, 2], [3, 4]]), "transform_matrix"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_transforms_raise_data_error(tmp_path, case):
    fn, words = BAD[case]
    truth = fx.make_scene(n_views=3)
    root = write_transforms(tmp_path / "s", truth)
    _edit(root, fn)
    with pytest.raises(DataError) as ei:
        load_scene(root, masks="ignore")
    msg = str(ei.value)
    assert words in msg and ("transforms.json" in msg or "none.png" in msg), msg
