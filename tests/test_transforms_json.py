"""The nerfstudio / instant-ngp transforms.json loader (splat/data/transforms.py).

Scenes are written into tmp_path from the ground truth in fixtures_data.py.
(Lens distortion through this loader: tests/test_undistort.py.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import fixtures_data as fx
import numpy as np
import pytest
import torch
from PIL import Image
from test_data import check_frames_match_truth

from splat.data import DataError, SceneData, load_scene


def write_transforms(root: Path, truth: fx.Scene, per_frame: bool = False, masks: bool = False, **top) -> Path:
    """One transforms.json; intrinsics global (or per frame), OpenGL c2w."""
    root = Path(root)
    fx.write_images(root / "images", truth.views)
    cam = truth.cams[0]
    fxx, fyy, cx, cy = cam.fxfycxcy()
    intr = {"fl_x": fxx, "fl_y": fyy, "cx": cx, "cy": cy, "w": cam.width, "h": cam.height}
    frames = []
    for v in truth.views:
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
    root = write_transforms(
        tmp_path / "s",
        truth,
        train_filenames=["images/view_01.png", "./images/view_02.png"],
        test_filenames=["images/view_04.png"],
    )
    s = load_scene(root)
    assert [f.stem for f in s.train] == ["view_01", "view_02"] and [f.stem for f in s.test] == ["view_04"]
    root = write_transforms(
        tmp_path / "v", truth, train_filenames=["images/view_00.png"], val_filenames=["images/view_03.png"]
    )
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
    v = np.array(
        [tuple(p) + tuple(c) for p, c in zip(truth.xyz, truth.rgb)],
        dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")],
    )
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
    "split name unknown": (lambda m: m.update(train_filenames=["images/nope.png"], test_filenames=[]), "nope.png"),
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


# ---------------------------------------------------------------- issue 27


def _one_camera_scene(tmp_path, layout: str, top: dict, frame: dict, width: int = 64, height: int = 48) -> Path:
    """Two frames of a ``width x height`` camera, ``top`` keys at the top
    level and ``frame`` keys in every frame, as transforms.json or as a
    NeRF-synthetic transforms_train.json."""
    truth = fx.make_scene(n_views=2, width=width, height=height)
    root = tmp_path / layout
    fx.write_images(root / "images", truth.views)
    frames = [
        dict(file_path=f"images/{v.name}", transform_matrix=fx.c2w_cv_to_gl(v.c2w_cv).tolist(), **frame)
        for v in truth.views
    ]
    name = "transforms.json" if layout == "transforms" else "transforms_train.json"
    fx.write_nerf_json(root / name, frames, **top)
    return root


PER_FRAME_WINS = {
    # top level, per frame, expected (fx, fy, cx, cy) of a 64 x 48 image
    "frame angle over top fl_x": (
        {"fl_x": 77.25, "fl_y": 77.25},
        {"camera_angle_x": 1.2},
        (32 / np.tan(0.6), 32 / np.tan(0.6), 32.0, 24.0),
    ),
    "frame fl_x over top angle": ({"camera_angle_x": 1.2}, {"fl_x": 50.0}, (50.0, 50.0, 32.0, 24.0)),
    "frame angle_y, top fl_x, fl_y": (
        {"fl_x": 77.25, "fl_y": 70.0},
        {"camera_angle_y": 1.0},
        (24 / np.tan(0.5), 24 / np.tan(0.5), 32.0, 24.0),
    ),
    "frame cx with top cx, cy": ({"fl_x": 50.0, "cx": 30.0, "cy": 20.0}, {"cx": 33.0}, (50.0, 50.0, 33.0, 24.0)),
    "top level only": ({"camera_angle_x": 1.2, "cy": 20.0}, {}, (32 / np.tan(0.6), 32 / np.tan(0.6), 32.0, 20.0)),
}


@pytest.mark.parametrize("layout", ["transforms", "nerf"])
@pytest.mark.parametrize("case", list(PER_FRAME_WINS))
def test_per_frame_intrinsics_win_over_top_level_ones(tmp_path, layout, case):
    top, frame, (efx, efy, ecx, ecy) = PER_FRAME_WINS[case]
    s = load_scene(_one_camera_scene(tmp_path, layout, top, frame), layout=layout, test_every=0)
    for f in s.train:
        np.testing.assert_allclose(f.K.numpy(), [[efx, 0, ecx], [0, efy, ecy], [0, 0, 1]], rtol=1e-6)
    if case == "frame angle over top fl_x":  # the "47.0 instead of 77.25"
        assert round(float(s.train[0].K[0, 0]), 1) == 46.8


def test_per_frame_distortion_groups(tmp_path):
    """Metashape writes camera_model at the top level and k1..k4 per frame:
    that is the same camera as all of it at the top level.  A frame's own k1
    (0) is not mixed with a top-level k2."""
    lens = {"k1": 0.05, "k2": 0.01, "k3": 0.002, "k4": 0.001}
    top = {"fl_x": 50.0, "camera_model": "OPENCV_FISHEYE"}
    a = load_scene(_one_camera_scene(tmp_path, "transforms", top, lens), test_every=0, cache_dir=tmp_path / "c")
    b = load_scene(
        _one_camera_scene(tmp_path / "b", "transforms", {**top, **lens}, {}), test_every=0, cache_dir=tmp_path / "c"
    )
    assert a.train[0].width != 64  # undistorted
    assert torch.equal(a.train[0].K, b.train[0].K) and torch.equal(a.train[0].image, b.train[0].image)
    top = {"fl_x": 50.0, "camera_model": "OPENCV"}
    c = load_scene(
        _one_camera_scene(tmp_path / "c", "transforms", {**top, "k2": 0.1}, {"k1": 0.0}),
        test_every=0,
        cache_dir=tmp_path / "c",
    )
    d = load_scene(_one_camera_scene(tmp_path / "d", "transforms", top, {}), test_every=0, cache_dir=tmp_path / "c")
    assert torch.equal(c.train[0].K, d.train[0].K) and torch.equal(c.train[0].image, d.train[0].image)


NUMERIC_KEYS = ["fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x", "camera_angle_y", "k1", "p2"]


@pytest.mark.parametrize("layout", ["transforms", "nerf"])
@pytest.mark.parametrize("where", ["top", "frame"])
@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_json_bools_and_strings_are_not_numbers(tmp_path, layout, where, key):
    base = {"fl_x": 50.0}
    for bad in (True, False, "50"):
        extra = {key: bad}
        top, frame = ({**base, **extra}, {}) if where == "top" else (base, extra)
        root = _one_camera_scene(tmp_path / f"{key}{bad}", layout, top, frame)
        with pytest.raises(DataError, match=rf"transforms(_train)?\.json: .*'{key}' must be a number, got "):
            load_scene(root, layout=layout, test_every=0)


@pytest.mark.parametrize("layout", ["transforms", "nerf"])
def test_transform_matrix_of_bools_is_refused(tmp_path, layout):
    root = _one_camera_scene(tmp_path, layout, {"fl_x": 50.0}, {})
    name = "transforms.json" if layout == "transforms" else "transforms_train.json"
    eye = [[True, False, False, False], [False, True, False, False], [False, False, True, 4], [0, 0, 0, 1]]
    _edit_file(root / name, lambda m: m["frames"][0].update(transform_matrix=eye))
    with pytest.raises(DataError, match=rf"{name}: frames\[0\]: 'transform_matrix' is not a numeric matrix"):
        load_scene(root, layout=layout, test_every=0)


def _edit_file(path: Path, fn):
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


ONE_LIST = {
    "train only": (dict(train_filenames=["images/view_01.png"]), "'train_filenames' without 'test_filenames'"),
    "test only": (dict(test_filenames=["images/view_01.png"]), "'test_filenames' without 'train_filenames'"),
    "val only": (dict(val_filenames=["images/view_01.png"]), "'val_filenames' without 'train_filenames'"),
}


@pytest.mark.parametrize("case", list(ONE_LIST))
def test_one_split_list_without_the_other_is_refused(tmp_path, case):
    """nerfstudio raises here too: frames in no list would silently drop out."""
    lists, words = ONE_LIST[case]
    root = write_transforms(tmp_path / "s", fx.make_scene(n_views=10), **lists)
    with pytest.raises(DataError, match=f"transforms.json: {words}"):
        load_scene(root)


def test_split_lists_edge_cases(tmp_path):
    truth = fx.make_scene(n_views=4)
    # an empty test list: no test split, frames outside the train list unused
    s = load_scene(write_transforms(tmp_path / "a", truth, train_filenames=["images/view_01.png"], test_filenames=[]))
    assert [f.stem for f in s.train] == ["view_01"] and s.test == []
    # the test list wins over the val list, val frames are not used
    s = load_scene(
        write_transforms(
            tmp_path / "b",
            truth,
            train_filenames=["images/view_01.png"],
            test_filenames=["images/view_02.png"],
            val_filenames=["images/view_03.png"],
        )
    )
    assert [f.stem for f in s.test] == ["view_02"]
    with pytest.raises(DataError, match="transforms.json: 'train_filenames' is empty"):
        load_scene(write_transforms(tmp_path / "c", truth, train_filenames=[], test_filenames=["images/view_02.png"]))


def test_one_frame_hints_test_every_0(tmp_path):
    truth = fx.make_scene(n_views=1)
    root = write_transforms(tmp_path / "t", truth)
    with pytest.raises(
        DataError,
        match=r"transforms.json: zero training frames \(1 frame\(s\), test_every=8.*"
        r"data.test_every=0",
    ):
        load_scene(root)
    assert len(load_scene(root, test_every=0).train) == 1
    col = fx.write_colmap_scene(tmp_path / "c", truth)
    with pytest.raises(DataError, match=r"images.txt: zero training frames .*data.test_every=0"):
        load_scene(col)


def _write_ply(path: Path, xyz: np.ndarray):
    from plyfile import PlyData, PlyElement

    v = np.array([tuple(p) for p in xyz], dtype=[("x", "f4"), ("y", "f4"), ("z", "f4")])
    PlyData([PlyElement.describe(v, "vertex")]).write(str(path))


def test_ply_with_zero_points_means_no_point_cloud(tmp_path, capsys):
    from splat.run_folder import scene_fingerprint

    root = write_transforms(tmp_path / "s", fx.make_scene(n_views=3), ply_file_path="empty.ply")
    _write_ply(root / "empty.ply", np.zeros((0, 3)))
    s = load_scene(root)
    assert s.points is None and s.point_colors is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty.ply" in err[0] and "0 points" in err[0], err
    scene_fingerprint(s)


def test_fingerprint_of_an_empty_point_cloud():
    """checkpoint._sha256_tensor took memoryview casts of empty arrays for an error."""
    from splat.run_folder import scene_fingerprint

    empty = SceneData(train=[], test=[], points=torch.zeros(0, 3), point_colors=torch.zeros(0, 3), layout="colmap")
    assert scene_fingerprint(empty) != scene_fingerprint(dataclasses.replace(empty, points=None, point_colors=None))
