"""Tests of splat.data: COLMAP (text + binary) and NeRF-synthetic loaders.

Every scene is written into ``tmp_path`` by tests/fixtures_data.py from
ground truth kept there; nothing outside the repo is read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import fixtures_data as fx
import numpy as np
import pytest
import torch
from PIL import Image

from splat.data import DataError, Frame, SceneData, load_scene
from splat.data.colmap import qvec_to_rotmat

# ---------------------------------------------------------------- helpers


def loaded_project(frame: Frame, pts: np.ndarray) -> np.ndarray:
    """Project world points [N, 3] with a loaded frame -> [N, 3] (u, v, z)."""
    V = frame.viewmat.double().numpy()
    K = frame.K.double().numpy()
    Xc = pts @ V[:3, :3].T + V[:3, 3]  # [N, 3]
    uvw = Xc @ K.T
    return np.stack([uvw[:, 0] / uvw[:, 2], uvw[:, 1] / uvw[:, 2], Xc[:, 2]], axis=1)


def by_stem(scene: SceneData) -> dict:
    return {f.stem: f for f in scene.train + scene.test}


def check_frames_match_truth(scene: SceneData, truth: fx.Scene, downscale: int = 1, atol_px: float = 1e-3):
    frames = by_stem(scene)
    assert len(frames) == len(truth.views)
    rng = np.random.default_rng(1)
    pts = np.concatenate([np.zeros((1, 3)), rng.normal(scale=0.7, size=(10, 3))])
    for v in truth.views:
        f = frames[Path(v.name).stem]
        cam = truth.cam_by_id[v.cam_id]
        fxx, fyy, cx, cy = cam.fxfycxcy()
        expected = fx.project(pts, v.c2w_cv, fxx, fyy, cx, cy)
        expected[:, :2] /= downscale
        got = loaded_project(f, pts)
        np.testing.assert_allclose(got[:, :2], expected[:, :2], atol=atol_px)
        np.testing.assert_allclose(got[:, 2], expected[:, 2], atol=1e-5)
        np.testing.assert_allclose(f.camera_center.numpy(), v.c2w_cv[:3, 3], atol=1e-5)
        assert f.viewmat.dtype == torch.float32 and f.viewmat.shape == (4, 4)
        assert f.K.dtype == torch.float32 and f.K.shape == (3, 3)
        assert f.image.dtype == torch.float32
        assert f.image.shape == (f.height, f.width, 3)
        assert (f.width, f.height) == (cam.width // downscale, cam.height // downscale)


# ---------------------------------------------------------------- COLMAP


def test_colmap_text_and_binary_agree_and_match_truth(tmp_path):
    truth = fx.make_scene(n_views=9)
    a = load_scene(fx.write_colmap_scene(tmp_path / "txt", truth, "text"))
    b = load_scene(fx.write_colmap_scene(tmp_path / "bin", truth, "binary"))
    assert a.layout == b.layout == "colmap"
    assert [f.stem for f in a.train] == [f.stem for f in b.train]
    assert [f.stem for f in a.test] == [f.stem for f in b.test]
    for fa, fb in zip(a.train + a.test, b.train + b.test):
        assert torch.equal(fa.viewmat, fb.viewmat)
        assert torch.equal(fa.K, fb.K)
        assert torch.equal(fa.image, fb.image)
        assert fa.mask is None and fb.mask is None
    assert torch.equal(a.points, b.points) and torch.equal(a.point_colors, b.point_colors)
    np.testing.assert_allclose(a.points.numpy(), truth.xyz, atol=1e-6)
    np.testing.assert_allclose(a.point_colors.numpy(), truth.rgb / 255.0, atol=1e-7)
    assert a.points.dtype == a.point_colors.dtype == torch.float32
    check_frames_match_truth(a, truth)
    check_frames_match_truth(b, truth)


def test_colmap_image_pixels_exact(tmp_path):
    truth = fx.make_scene(n_views=3)
    scene = load_scene(fx.write_colmap_scene(tmp_path, truth), test_every=0)
    frames = by_stem(scene)
    for v in truth.views:
        np.testing.assert_allclose(frames[Path(v.name).stem].image.numpy(), v.pixels / 255.0, atol=1e-7)


def test_colmap_target_projects_to_principal_point(tmp_path):
    # A camera looking straight at a point sees it at (cx, cy), off-centre or not.
    truth = fx.make_scene(n_views=4, params=[14.0, 15.0, 5.3, 7.9])
    for v in truth.views:
        v.c2w_cv = fx.look_at_c2w_cv(v.c2w_cv[:3, 3], target=(0.0, 0.0, 0.0))
    scene = load_scene(fx.write_colmap_scene(tmp_path, truth, "binary"), test_every=0)
    for f in scene.train:
        uvz = loaded_project(f, np.zeros((1, 3)))[0]
        np.testing.assert_allclose(uvz[:2], [5.3, 7.9], atol=1e-4)
        assert uvz[2] > 0


def test_colmap_split_every_nth_in_name_order(tmp_path):
    truth = fx.make_scene(n_views=10)  # image ids are shuffled relative to names
    root = fx.write_colmap_scene(tmp_path, truth)
    s = load_scene(root)  # test_every = 8
    assert [f.stem for f in s.test] == ["view_00", "view_08"]
    assert [f.stem for f in s.train] == [f"view_{k:02d}" for k in range(10) if k % 8]
    s3 = load_scene(root, test_every=3)
    assert [f.stem for f in s3.test] == ["view_00", "view_03", "view_06", "view_09"]
    s0 = load_scene(root, test_every=0)
    assert s0.test == [] and len(s0.train) == 10


def test_colmap_simple_pinhole_off_centre(tmp_path):
    truth = fx.make_scene(n_views=5, model="SIMPLE_PINHOLE", params=[13.5, 6.25, 4.75])
    for fmt in ("text", "binary"):
        scene = load_scene(fx.write_colmap_scene(tmp_path / fmt, truth, fmt), test_every=0)
        K = scene.train[0].K
        assert torch.equal(K, torch.tensor([[13.5, 0, 6.25], [0, 13.5, 4.75], [0, 0, 1.0]]))
        check_frames_match_truth(scene, truth)


def test_colmap_sparse_without_0_subfolder(tmp_path):
    truth = fx.make_scene(n_views=4)
    scene = load_scene(fx.write_colmap_scene(tmp_path, truth, "binary", sparse_subdir="sparse"), test_every=0)
    assert scene.layout == "colmap"
    check_frames_match_truth(scene, truth)


def test_colmap_no_points_gives_none(tmp_path):
    truth = fx.make_scene(n_views=4, n_points=0)
    for fmt in ("text", "binary"):
        scene = load_scene(fx.write_colmap_scene(tmp_path / fmt, truth, fmt))
        assert scene.points is None and scene.point_colors is None


def test_qvec_to_rotmat_roundtrip():
    rng = np.random.default_rng(0)
    for _ in range(20):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        R = q * np.sign(np.linalg.det(q))
        np.testing.assert_allclose(qvec_to_rotmat(fx.rotmat_to_qvec(R)), R, atol=1e-12)


# ---------------------------------------------------------------- downscale


@pytest.mark.parametrize("size", [(16, 12), (17, 13)])
def test_downscale_scales_K_and_area_averages(tmp_path, size):
    W, H = size
    truth = fx.make_scene(n_views=3, width=W, height=H, params=[14.0, 15.0, 5.3, 7.9], rgba=True)
    root = fx.write_colmap_scene(tmp_path, truth)
    full = load_scene(root, test_every=0, background=(0.2, 0.4, 0.6))
    half = load_scene(root, test_every=0, downscale=2, background=(0.2, 0.4, 0.6))
    for f1, f2 in zip(full.train, half.train):
        assert (f2.width, f2.height) == (W // 2, H // 2)
        assert torch.allclose(f2.K, torch.tensor([[7.0, 0, 2.65], [0, 7.5, 3.95], [0, 0, 1.0]]))
        assert torch.equal(f2.viewmat, f1.viewmat)
        # area averaging of the composited image and of the mask (odd sizes cropped)
        img = f1.image[: H // 2 * 2, : W // 2 * 2]
        exp = img.reshape(H // 2, 2, W // 2, 2, 3).mean(dim=(1, 3))
        torch.testing.assert_close(f2.image, exp, atol=1e-6, rtol=0)
        m = f1.mask[: H // 2 * 2, : W // 2 * 2]
        torch.testing.assert_close(f2.mask, m.reshape(H // 2, 2, W // 2, 2).mean(dim=(1, 3)), atol=1e-6, rtol=0)
    check_frames_match_truth(half, truth, downscale=2)


def test_downscale_pixel_centre_exact(tmp_path):
    # The point seen at the centre of full-res pixel (j, i) = (2J+1 - 0.5 ...):
    # a point at full-res coordinate u lands at u / s in the downscaled image.
    truth = fx.make_scene(n_views=2, params=[14.0, 15.0, 5.3, 7.9])
    root = fx.write_colmap_scene(tmp_path, truth)
    f1 = load_scene(root, test_every=0).train[0]
    f4 = load_scene(root, test_every=0, downscale=4).train[0]
    pts = np.random.default_rng(3).normal(scale=0.5, size=(5, 3))
    np.testing.assert_allclose(loaded_project(f4, pts)[:, :2], loaded_project(f1, pts)[:, :2] / 4, atol=1e-5)


def test_downscale_argument_validation(tmp_path):
    root = fx.write_colmap_scene(tmp_path, fx.make_scene(n_views=2))
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError):
            load_scene(root, downscale=bad)
    with pytest.raises(ValueError):
        load_scene(root, layout="blender")


# ---------------------------------------------------------------- NeRF


def test_nerf_rgba_composited_and_mask_kept(tmp_path):
    truth = fx.make_scene(n_views=4, params=[14.0, 14.0, 8.0, 6.0], rgba=True)
    # make some pixels fully transparent / opaque
    truth.views[0].pixels[0, 0, 3] = 0
    truth.views[0].pixels[0, 1, 3] = 255
    bg = (0.25, 0.5, 1.0)
    scene = load_scene(fx.write_nerf_scene(tmp_path, truth, n_test=1), background=bg)
    assert scene.layout == "nerf" and scene.points is None and scene.point_colors is None
    assert len(scene.train) == 3 and len(scene.test) == 1
    frames = by_stem(scene)
    for v in truth.views:
        f = frames[Path(v.name).stem]
        px = v.pixels.astype(np.float64) / 255.0
        a = px[..., 3:]
        exp = px[..., :3] * a + np.asarray(bg) * (1 - a)
        np.testing.assert_allclose(f.image.numpy(), exp, atol=1e-6)
        np.testing.assert_allclose(f.mask.numpy(), a[..., 0], atol=1e-7)
        assert f.mask.shape == (f.height, f.width) and f.mask.dtype == torch.float32
    f0 = frames["view_00"]
    np.testing.assert_allclose(f0.image[0, 0].numpy(), bg, atol=1e-7)
    np.testing.assert_allclose(f0.image[0, 1].numpy(), truth.views[0].pixels[0, 1, :3] / 255.0, atol=1e-7)
    check_frames_match_truth(scene, truth)


def test_nerf_opengl_to_opencv_projection(tmp_path):
    # OpenGL camera at +z, identity rotation: looks along -z at the origin, y up.
    W, H = 16, 12
    angle = 2 * math.atan(0.5 * W / 10.0)  # fx = 10
    (tmp_path / "img.png").parent.mkdir(exist_ok=True)
    Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(tmp_path / "img.png")
    c2w = np.eye(4)
    c2w[2, 3] = 4.0
    fx.write_nerf_json(tmp_path / "transforms_train.json", [("img.png", c2w)], camera_angle_x=angle)
    scene = load_scene(tmp_path)
    f = scene.train[0]
    assert scene.test == []
    np.testing.assert_allclose(f.K.numpy(), [[10, 0, 8], [0, 10, 6], [0, 0, 1]], atol=1e-5)
    o, px, py, pz = loaded_project(f, np.array([[0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]))
    np.testing.assert_allclose(o, [8.0, 6.0, 4.0], atol=1e-5)  # origin at the principal point, depth 4
    np.testing.assert_allclose(px, [8.0 + 10 / 4, 6.0, 4.0], atol=1e-5)  # world +x: to the right
    np.testing.assert_allclose(py, [8.0, 6.0 - 10 / 4, 4.0], atol=1e-5)  # world +y (up): smaller row
    assert pz[2] == pytest.approx(3.0)  # towards the camera: nearer
    np.testing.assert_allclose(f.camera_center.numpy(), [0, 0, 4], atol=1e-6)


def test_nerf_and_colmap_of_same_cameras_agree(tmp_path):
    truth = fx.make_scene(n_views=6, params=[14.0, 14.0, 8.0, 6.0])
    root = tmp_path / "both"
    fx.write_nerf_scene(root, truth, n_test=0)
    fx.write_colmap_scene(root, truth, "binary")
    c = load_scene(root, test_every=0)  # auto prefers COLMAP
    n = load_scene(root, layout="nerf")
    assert c.layout == "colmap" and n.layout == "nerf"
    cn = by_stem(n)
    for f in c.train:
        torch.testing.assert_close(f.viewmat, cn[f.stem].viewmat, atol=1e-5, rtol=0)
        torch.testing.assert_close(f.K, cn[f.stem].K, atol=1e-4, rtol=0)
    assert c.scene_radius() == pytest.approx(n.scene_radius(), rel=1e-5)


def test_nerf_file_path_without_extension(tmp_path):
    truth = fx.make_scene(n_views=3, params=[14.0, 14.0, 8.0, 6.0])
    scene = load_scene(fx.write_nerf_scene(tmp_path, truth, n_test=1, with_ext=False))
    assert [f.stem for f in scene.train] == ["view_00", "view_01"]
    assert scene.train[0].image_path.name == "view_00.png"


def test_nerf_explicit_intrinsics(tmp_path):
    truth = fx.make_scene(n_views=3, params=[14.0, 15.0, 5.3, 7.9])
    root = fx.write_nerf_scene(tmp_path, truth, n_test=0, fl_x=14.0, fl_y=15.0, cx=5.3, cy=7.9, w=16, h=12)
    check_frames_match_truth(load_scene(root), truth)
    half = load_scene(root, downscale=2)
    assert torch.allclose(half.train[0].K, torch.tensor([[7.0, 0, 2.65], [0, 7.5, 3.95], [0, 0, 1]]))


def test_nerf_per_frame_intrinsics_override(tmp_path):
    truth = fx.make_scene(n_views=2, params=[14.0, 14.0, 8.0, 6.0])
    fx.write_images(tmp_path / "images", truth.views)
    frames = [
        {"file_path": "images/view_00.png", "transform_matrix": fx.c2w_cv_to_gl(truth.views[0].c2w_cv).tolist()},
        {
            "file_path": "images/view_01.png",
            "transform_matrix": fx.c2w_cv_to_gl(truth.views[1].c2w_cv).tolist(),
            "fl_x": 20.0,
            "cx": 7.0,
        },
    ]
    fx.write_nerf_json(tmp_path / "transforms_train.json", frames, fl_x=14.0)
    s = load_scene(tmp_path)
    assert torch.allclose(s.train[0].K, torch.tensor([[14.0, 0, 8], [0, 14, 6], [0, 0, 1]]))
    assert torch.allclose(s.train[1].K, torch.tensor([[20.0, 0, 7], [0, 20, 6], [0, 0, 1]]))


# ---------------------------------------------------------------- layout, radius


def test_layout_detection(tmp_path):
    truth = fx.make_scene(n_views=3, params=[14.0, 14.0, 8.0, 6.0])
    assert load_scene(fx.write_nerf_scene(tmp_path / "n", truth, n_test=0)).layout == "nerf"
    assert load_scene(fx.write_colmap_scene(tmp_path / "c", truth)).layout == "colmap"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty"):
        load_scene(tmp_path / "empty")
    with pytest.raises(DataError, match="nowhere"):
        load_scene(tmp_path / "nowhere")
    with pytest.raises(DataError, match="transforms_train.json"):
        load_scene(tmp_path / "c", layout="nerf")
    with pytest.raises(DataError, match="sparse"):
        load_scene(tmp_path / "n", layout="colmap")


def test_scene_radius_and_camera_center():
    def frame(center):
        V = torch.eye(4)
        V[:3, 3] = -torch.tensor(center)  # identity rotation: t = -C
        return Frame("x", Path("x.png"), torch.zeros(1, 1, 3), None, V, torch.eye(3), 1, 1)

    s = SceneData([frame([1.0, 0, 0]), frame([-1.0, 0, 0]), frame([0, 3.0, 0])], [], None, None, "colmap")
    np.testing.assert_allclose(s.train[2].camera_center.numpy(), [0, 3, 0])
    # mean (0, 1, 0); farthest camera (0, 3, 0) at distance 2
    assert s.scene_radius() == pytest.approx(2.0 * 1.1)
    assert SceneData([frame([1.0, 2, 3])], [], None, None, "nerf").scene_radius() == 1.0


# ---------------------------------------------------------------- bad data

# Each case: (builder(tmp_path) -> (root, kwargs), substring the message must
# contain (the offending file's name), optional extra substring).


def _colmap(tmp_path, fmt="text", **kw):
    truth = fx.make_scene(n_views=4, **kw)
    return fx.write_colmap_scene(tmp_path / "s", truth, fmt), truth


def _nerf(tmp_path, **kw):
    truth = fx.make_scene(n_views=3, params=[14.0, 14.0, 8.0, 6.0])
    return fx.write_nerf_scene(tmp_path / "s", truth, n_test=1, **kw), truth


def _edit(path: Path, fn):
    path.write_text(fn(path.read_text()))


def _edit_json(path: Path, fn):
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def case_missing_image(t):
    root, _ = _colmap(t)
    (root / "images" / "view_02.png").unlink()
    return root, "view_02.png"


def case_truncated_image(t):
    root, _ = _colmap(t)
    fx.truncate_file(root / "images" / "view_01.png", 30)
    return root, "view_01.png"


def case_garbage_image(t):
    root, _ = _colmap(t)
    (root / "images" / "view_03.png").write_bytes(b"this is not a png")
    return root, "view_03.png"


def case_truncated_cameras_bin(t):
    root, _ = _colmap(t, "binary")
    fx.truncate_file(root / "sparse/0/cameras.bin", 3)
    return root, "cameras.bin", "truncated"


def case_truncated_images_bin(t):
    root, _ = _colmap(t, "binary")
    fx.truncate_file(root / "sparse/0/images.bin", 7)
    return root, "images.bin", "truncated"


def case_truncated_images_bin_in_name(t):
    root, _ = _colmap(t, "binary")
    data = (root / "sparse/0/images.bin").read_bytes()
    # one image whose name never ends: enough bytes for the count check, no NUL
    start = data.index(b"view_")
    (root / "sparse/0/images.bin").write_bytes(struct.pack("<Q", 1) + data[8:start] + b"v" * 200)
    return root, "images.bin", "unterminated"


def case_truncated_points_bin(t):
    root, _ = _colmap(t, "binary")
    fx.truncate_file(root / "sparse/0/points3D.bin", 9)
    return root, "points3D.bin", "truncated"


def case_huge_count_bin(t):
    root, _ = _colmap(t, "binary")
    p = root / "sparse/0/points3D.bin"
    data = p.read_bytes()
    p.write_bytes(struct.pack("<Q", 2**40) + data[8:])
    return root, "points3D.bin"


def case_trailing_bytes_bin(t):
    root, _ = _colmap(t, "binary")
    p = root / "sparse/0/images.bin"
    p.write_bytes(p.read_bytes() + b"\x01\x02")
    return root, "images.bin", "trailing"


def case_unknown_model_id_bin(t):
    root, _ = _colmap(t, "binary")
    p = root / "sparse/0/cameras.bin"
    data = bytearray(p.read_bytes())
    data[12:16] = struct.pack("<i", 99)  # model id of the first camera
    p.write_bytes(bytes(data))
    return root, "cameras.bin", "99"


def case_malformed_cameras_txt(t):
    root, _ = _colmap(t)
    _edit(root / "sparse/0/cameras.txt", lambda s: s.replace(" 16 12 ", " 16 twelve "))
    return root, "cameras.txt", "line"


def case_wrong_param_count_txt(t):
    root, _ = _colmap(t)
    _edit(root / "sparse/0/cameras.txt", lambda s: s.replace("PINHOLE 16 12 14.0", "PINHOLE 16 12"))
    return root, "cameras.txt", "parameters"


def case_malformed_images_txt(t):
    root, _ = _colmap(t)
    _edit(root / "sparse/0/images.txt", lambda s: s.replace(" 1 view_01.png", " view_01.png"))
    return root, "images.txt", "line"


def case_images_txt_missing_points_lines(t):
    root, _ = _colmap(t)
    # drop every POINTS2D line: image headers follow each other directly
    lines = (root / "sparse/0/images.txt").read_text().splitlines()
    keep = [ln for ln in lines if ln.startswith("#") or "view_" in ln]
    (root / "sparse/0/images.txt").write_text("\n".join(keep) + "\n")
    return root, "images.txt", "POINTS2D"


def case_malformed_points_txt(t):
    root, _ = _colmap(t)
    _edit(root / "sparse/0/points3D.txt", lambda s: s.replace(" 0.5 ", " nan? ", 1))
    return root, "points3D.txt", "line"


def case_malformed_points_txt_coordinate(t):
    root, _ = _colmap(t)
    lines = (root / "sparse/0/points3D.txt").read_text().splitlines()
    tok = lines[3].split()
    tok[2] = "1.0.0"
    lines[3] = " ".join(tok)
    (root / "sparse/0/points3D.txt").write_text("\n".join(lines) + "\n")
    return root, "points3D.txt", "line 4"


def case_missing_camera_id(t):
    root, _ = _colmap(t)
    _edit(root / "sparse/0/images.txt", lambda s: s.replace(" 1 view_01.png", " 7 view_01.png"))
    return root, "images.txt", "camera id 7"


def case_missing_camera_id_bin(t):
    truth = fx.make_scene(n_views=4)
    truth.views[2].cam_id = 5
    root = fx.write_colmap_scene(t / "s", truth, "binary")
    return root, "images.bin", "camera id 5"


def case_size_mismatch(t):
    root, truth = _colmap(t)
    Image.fromarray(np.zeros((12, 15, 3), np.uint8)).save(root / "images" / "view_02.png")
    return root, "view_02.png", "mismatch"


def case_unsupported_model_txt(t):
    root, _ = _colmap(t)
    _edit(
        root / "sparse/0/cameras.txt",
        lambda s: s.replace("1 PINHOLE 16 12 14.0 15.0 8.0 6.0", "1 FOV 16 12 14.0 15.0 8.0 6.0 0.1"),
    )
    return root, "cameras.txt", "image_undistorter"


def case_unsupported_model_bin(t):
    truth = fx.make_scene(n_views=4, model="THIN_PRISM_FISHEYE", params=[14.0, 15.0, 8.0, 6.0] + [0.01] * 8)
    root = fx.write_colmap_scene(t / "s", truth, "binary")
    return root, "cameras.bin", "THIN_PRISM_FISHEYE"


def case_zero_images(t):
    root, _ = _colmap(t)
    (root / "sparse/0/images.txt").write_text("# no images\n")
    return root, "images.txt", "zero"


def case_all_images_in_test(t):
    truth = fx.make_scene(n_views=1)
    root = fx.write_colmap_scene(t / "s", truth)
    return root, "images.txt", "zero"


def case_missing_points_file(t):
    root, _ = _colmap(t, "binary")
    (root / "sparse/0/points3D.bin").unlink()
    return root, "points3D.bin", "missing"


def case_nerf_missing_json(t):
    root, _ = _nerf(t)
    (root / "transforms_train.json").rename(root / "transforms_val.json")
    return root, "transforms_train.json", None, {"layout": "nerf"}


def case_nerf_invalid_json(t):
    root, _ = _nerf(t)
    (root / "transforms_test.json").write_text('{"frames": [')
    return root, "transforms_test.json"


def case_nerf_missing_frames(t):
    root, _ = _nerf(t)
    _edit_json(root / "transforms_train.json", lambda d: d.pop("frames"))
    return root, "transforms_train.json", "frames"


def case_nerf_missing_transform(t):
    root, _ = _nerf(t)
    _edit_json(root / "transforms_test.json", lambda d: d["frames"][0].pop("transform_matrix"))
    return root, "transforms_test.json", "transform_matrix"


def case_nerf_missing_focal(t):
    root, _ = _nerf(t)
    _edit_json(root / "transforms_train.json", lambda d: d.pop("camera_angle_x"))
    return root, "transforms_train.json", "camera_angle_x"


def case_nerf_bad_matrix(t):
    root, _ = _nerf(t)
    _edit_json(root / "transforms_train.json", lambda d: d["frames"][1].update(transform_matrix=[[1, 0], [0, 1]]))
    return root, "transforms_train.json", "frames[1]"


def case_nerf_empty_frames(t):
    root, _ = _nerf(t)
    _edit_json(root / "transforms_train.json", lambda d: d.update(frames=[]))
    return root, "transforms_train.json", "zero"


def case_nerf_missing_image(t):
    root, _ = _nerf(t)
    (root / "images" / "view_01.png").unlink()
    return root, "view_01.png"


def case_nerf_truncated_image(t):
    root, _ = _nerf(t)
    fx.truncate_file(root / "images" / "view_00.png", 40)
    return root, "view_00.png"


def case_nerf_size_mismatch(t):
    root, _ = _nerf(t, w=20, h=12)
    return root, "transforms_train.json", "mismatch"


def _patch(path: Path, offset: int, fmt: str, *values):
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    path.write_bytes(bytes(data))


# Issue 9: non-finite values in binary files, absurd poses, reflections, huge images.
def case_nan_point_bin(t):
    root, _ = _colmap(t, "binary")
    _patch(root / "sparse/0/points3D.bin", 8 + 8 + 8, "<d", float("nan"))  # y of the first point
    return root, "points3D.bin", "non-finite"


def case_inf_point_txt(t):
    root, _ = _colmap(t)
    lines = (root / "sparse/0/points3D.txt").read_text().splitlines()
    tok = lines[3].split()
    tok[1] = "1e300"
    lines[3] = " ".join(tok)
    (root / "sparse/0/points3D.txt").write_text("\n".join(lines) + "\n")
    return root, "points3D.txt", "absurd"


def case_nan_camera_bin(t):
    root, _ = _colmap(t, "binary")
    _patch(root / "sparse/0/cameras.bin", 8 + 24, "<d", float("nan"))  # fx of the first camera
    return root, "cameras.bin", "non-finite"


def case_absurd_principal_point_bin(t):
    root, _ = _colmap(t, "binary")
    _patch(root / "sparse/0/cameras.bin", 8 + 24 + 16, "<d", 1e308)  # cx of the first camera
    return root, "cameras.bin", "absurd intrinsics"


def case_absurd_translation_bin(t):
    root, _ = _colmap(t, "binary")
    _patch(root / "sparse/0/images.bin", 8 + 4 + 32, "<d", 1e308)  # tx of the first image
    return root, "images.bin", "absurd camera pose"


def case_absurd_translation_txt(t):
    root, _ = _colmap(t)
    lines = (root / "sparse/0/images.txt").read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if "view_01.png" in ln)
    tok = lines[k].split()
    tok[6] = "-1e308"
    lines[k] = " ".join(tok)
    (root / "sparse/0/images.txt").write_text("\n".join(lines) + "\n")
    return root, "images.txt", "view_01.png"


def case_nerf_reflection(t):
    root, _ = _nerf(t)

    def mirror(d):
        m = np.array(d["frames"][1]["transform_matrix"])
        m[:3, 0] *= -1  # flip the camera's x axis: determinant -1
        d["frames"][1]["transform_matrix"] = m.tolist()

    _edit_json(root / "transforms_train.json", mirror)
    return root, "transforms_train.json", "frames[1]: 'transform_matrix' is a reflection"


def case_nerf_absurd_translation(t):
    root, _ = _nerf(t)

    def far_away(d):
        d["frames"][0]["transform_matrix"][0][3] = 1e308

    _edit_json(root / "transforms_test.json", far_away)
    return root, "transforms_test.json", "frames[0]: absurd camera pose"


def case_decompression_bomb_image(t):
    root, _ = _colmap(t)
    fx.write_png(root / "images" / "view_01.png", np.zeros((2, 2), np.uint8), size=(12_000, 9_000))
    return root, "view_01.png", "larger than the limit"


def case_nerf_decompression_bomb_image(t):
    root, _ = _nerf(t)
    fx.write_png(root / "images" / "view_02.png", np.zeros((2, 2), np.uint8), size=(30_000, 30_000))
    return root, "view_02.png", "too large"


BAD_CASES = [v for k, v in sorted(globals().items()) if k.startswith("case_")]


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.__name__[5:])
def test_bad_data_raises_data_error_naming_file(tmp_path, case):
    out = case(tmp_path)
    root, name = out[0], out[1]
    extra = out[2] if len(out) > 2 else None
    kwargs = out[3] if len(out) > 3 else {}
    with pytest.raises(DataError) as ei:
        load_scene(root, **kwargs)
    msg = str(ei.value)
    assert name in msg, msg
    if extra is not None:
        assert extra in msg, msg


# ---------------------------------------------------------------- image modes (issue 9, finding 4)


def _modes():
    """(name, writer(path) -> expected [H, W, 3|4] float in [0, 1], suffix)."""
    rng = np.random.default_rng(7)
    H, W = 5, 6
    g8 = rng.integers(0, 256, (H, W), dtype=np.uint8)
    c8 = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
    g16 = rng.integers(0, 65536, (H, W), dtype=np.uint16)
    g16[0, 0], g16[0, 1] = 65535, 300  # a full-scale and a dark sample (300 saturated at 255 before)
    c16 = rng.integers(0, 65536, (H, W, 4), dtype=np.uint16)
    grey = lambda v: np.repeat(v[..., None], 3, -1)  # noqa: E731

    def pil(mode, arr, expected, **kw):
        def write(p):
            Image.fromarray(arr).convert(mode).save(p, **kw) if mode != "keep" else Image.fromarray(arr).save(p, **kw)
            return expected

        return write

    def png(arr, expected):
        def write(p):
            fx.write_png(p, arr)
            return expected

        return write

    palette = Image.fromarray(c8[..., :3]).quantize(8)
    pal_rgb = np.asarray(palette.convert("RGB")) / 255.0

    def palette_png(p, transparency=None):
        palette.save(p, **({} if transparency is None else {"transparency": transparency}))
        if transparency is None:
            return pal_rgb
        alpha = (np.asarray(palette) != transparency).astype(np.float64)[..., None]
        return np.concatenate([pal_rgb, alpha], -1)

    f32 = rng.random((H, W)).astype(np.float32)
    return [
        ("L", png(g8, grey(g8 / 255.0)), ".png"),
        ("LA", png(c8[..., :2], np.concatenate([grey(c8[..., 0] / 255.0), c8[..., 1:2] / 255.0], -1)), ".png"),
        ("RGB", png(c8[..., :3], c8[..., :3] / 255.0), ".png"),
        ("RGBA", png(c8, c8 / 255.0), ".png"),
        ("P", palette_png, ".png"),
        ("P_transparency", lambda p: palette_png(p, transparency=2), ".png"),
        ("1", pil("1", (g8 > 127).astype(np.uint8) * 255, grey((g8 > 127).astype(np.float64))), ".png"),
        ("I;16_png", png(g16, grey(g16 / 65535.0)), ".png"),
        ("I;16_tiff", pil("keep", g16, grey(g16 / 65535.0)), ".tif"),
        (
            "I;16B_tiff",
            lambda p: (Image.frombytes("I;16B", (W, H), g16.astype(">u2").tobytes()).save(p), grey(g16 / 65535.0))[1],
            ".tif",
        ),
        ("I_tiff", pil("keep", g16.astype(np.int32), grey(g16 / 65535.0)), ".tif"),
        ("F_tiff", pil("keep", f32, grey(f32.astype(np.float64))), ".tif"),
        ("LA16", png(c16[..., :2], np.concatenate([grey(c16[..., 0] / 65535.0), c16[..., 1:2] / 65535.0], -1)), ".png"),
        ("RGB16", png(c16[..., :3], c16[..., :3] / 65535.0), ".png"),
        ("RGBA16", png(c16, c16 / 65535.0), ".png"),
    ]


@pytest.mark.parametrize("mode", _modes(), ids=lambda m: m[0])
def test_read_image_every_mode_at_full_bit_depth(tmp_path, mode):
    """8- and 16-bit images in every mode load with the right scale: a 16-bit
    greyscale PNG (Pillow mode I;16) used to saturate at 1.0 (issue 9)."""
    from splat.data.types import read_image

    name, write, suffix = mode
    path = tmp_path / f"img{suffix}"
    expected = write(path)
    got = read_image(path)
    assert got.dtype == np.float32 and got.shape == expected.shape, (got.shape, expected.shape)
    # exact up to float32 rounding of k / 255 or k / 65535
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_load_image_16bit_grey_is_not_saturated(tmp_path):
    from splat.data.types import load_image

    g16 = np.array([[0, 300, 32768, 65535]], np.uint16)
    fx.write_png(tmp_path / "g.png", g16)
    img, mask = load_image(tmp_path / "g.png", 1, torch.ones(3))
    assert mask is None
    np.testing.assert_allclose(img[0, :, 1].numpy(), g16[0] / 65535.0, rtol=0, atol=1e-7)


@pytest.mark.parametrize("bad,message", [("I", "outside 0..65535"), ("F", "outside \\[0, 1\\]")])
def test_read_image_out_of_range_integer_and_float_images(tmp_path, bad, message):
    from splat.data.types import read_image

    arr = np.array([[0, 70000]], np.int32) if bad == "I" else np.array([[0.5, 2.0]], np.float32)
    Image.fromarray(arr).save(tmp_path / "x.tif")
    with pytest.raises(DataError, match=f"x.tif: .*{message}"):
        read_image(tmp_path / "x.tif")


@pytest.mark.parametrize("size", [(10_000, 10_000), (20_000, 20_000)])
def test_decompression_bomb_is_refused_naming_the_file(tmp_path, size):
    """A header claiming 1e8 (over splat's limit) or 4e8 pixels (over Pillow's
    own bomb limit) is refused before decoding."""
    from splat.data.types import image_size, read_image

    fx.write_png(tmp_path / "bomb.png", np.zeros((2, 2), np.uint8), size=size)
    for fn in (image_size, read_image):
        with pytest.raises(DataError, match="bomb.png: image .*(too large|larger than the limit)"):
            fn(tmp_path / "bomb.png")


def test_read_image_ignores_exif_orientation(tmp_path):
    """A phone's portrait JPEG stores landscape pixels with EXIF
    orientation 6 (rotate 90 degrees to view).  The reader returns the stored
    pixels, as COLMAP does, so that poses from COLMAP or convert.py match."""
    from splat.data.types import read_image

    arr = np.zeros((20, 40, 3), np.uint8)
    arr[:, :20] = 255  # left half white in the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    path = tmp_path / "portrait.jpg"
    Image.fromarray(arr).save(path, exif=exif.tobytes(), quality=95)
    with Image.open(path) as im:
        assert im.getexif()[0x0112] == 6
    img = read_image(path)
    assert img.shape == (20, 40, 3)
    assert img[:, :15].mean() > 0.95 and img[:, 25:].mean() < 0.05
