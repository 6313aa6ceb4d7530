"""Lens undistortion at load (splat/data/undistort.py).

The main test renders a smooth scene with splat.rasterize from a pinhole
camera, distorts it with known coefficients (the forward model written out
here by hand, inverted by fixed-point iteration, resampled with cv2.remap),
loads it through the COLMAP and transforms.json loaders, and compares the
loaded (undistorted) image with a render from the loaded pinhole camera.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

cv2 = pytest.importorskip("cv2")

import splat
from splat.data import load_scene
from splat.data.undistort import LensCamera, distort_points, undistorted_camera
from splat.testing import look_at_viewmat

W, H = 96, 72
FX, FY, CX, CY = 70.0, 72.0, 48.6, 35.3  # splat convention (top-left pixel centre at 0.5)


# ------------------------------------------------- forward models, by hand
def forward(model: str, p, x, y):
    """COLMAP's camera models (src/colmap/sensor/models.h) written out:
    normalised undistorted (x, y) -> distorted pixels (u, v)."""
    p = list(p)
    r2 = x * x + y * y
    if model in ("SIMPLE_RADIAL", "RADIAL"):
        f, cx, cy = p[:3]
        k1, k2 = (p[3], 0.0) if model == "SIMPLE_RADIAL" else (p[3], p[4])
        s = 1 + k1 * r2 + k2 * r2 * r2
        return f * x * s + cx, f * y * s + cy
    fx, fy, cx, cy = p[:4]
    if model == "OPENCV_FISHEYE":
        k1, k2, k3, k4 = p[4:8]
        r = np.sqrt(r2)
        th = np.arctan(r)
        thd = th * (1 + k1 * th**2 + k2 * th**4 + k3 * th**6 + k4 * th**8)
        s = np.where(r > 1e-12, thd / np.maximum(r, 1e-12), 1.0)
        return fx * x * s + cx, fy * y * s + cy
    k1, k2, p1, p2 = p[4:8]
    k3, k4, k5, k6 = p[8:12] if model == "FULL_OPENCV" else (0.0, 0.0, 0.0, 0.0)
    radial = (1 + k1 * r2 + k2 * r2**2 + k3 * r2**3) / (1 + k4 * r2 + k5 * r2**2 + k6 * r2**3)
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return fx * xd + cx, fy * yd + cy


def inverse(model, p, u, v, iters=200):
    """Distorted pixels -> normalised undistorted points, by fixed-point
    iteration on the hand-written forward model (independent of OpenCV)."""
    fx, fy, cx, cy = (p[0], p[0], p[1], p[2]) if model in ("SIMPLE_RADIAL", "RADIAL") else p[:4]
    xd, yd = (u - cx) / fx, (v - cy) / fy
    x, y = xd.copy(), yd.copy()
    for _ in range(iters):
        uu, vv = forward(model, p, x, y)
        x = x - ((uu - cx) / fx - xd) * 0.9
        y = y - ((vv - cy) / fy - yd) * 0.9
    return x, y


CAMERAS = {
    "SIMPLE_RADIAL": (FX, CX, CY, -0.12),
    "RADIAL": (FX, CX, CY, -0.1, 0.02),
    "OPENCV": (FX, FY, CX, CY, -0.12, 0.025, 0.002, -0.0015),
    "FULL_OPENCV": (FX, FY, CX, CY, -0.1, 0.02, 0.001, -0.001, 0.004, 0.01, -0.005, 0.002),
    "OPENCV_FISHEYE": (FX, FY, CX, CY, 0.05, -0.02, 0.004, -0.001),
}


@pytest.mark.parametrize("model", list(CAMERAS))
def test_forward_models_match_colmap_formulas(model):
    rng = np.random.default_rng(0)
    xy = rng.uniform(-0.6, 0.6, size=(50, 2))
    got = distort_points(LensCamera(model, W, H, CAMERAS[model]), xy)
    u, v = forward(model, CAMERAS[model], xy[:, 0], xy[:, 1])
    np.testing.assert_allclose(got, np.stack([u, v], 1), atol=1e-9)


# ------------------------------------------------- the rendered fixture
def _scene():
    g = torch.Generator().manual_seed(3)
    n = 400
    # A wall of large, opaque, overlapping surfels facing the camera: smooth colour everywhere.
    means = torch.cat([(torch.rand(n, 2, generator=g) * 2 - 1) * torch.tensor([3.0, 2.4]), torch.zeros(n, 1)], 1)
    means[:, 2] = torch.rand(n, generator=g) * 0.2
    return dict(
        means=means,
        quats=torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1),
        scales=torch.rand(n, 2, generator=g) * 0.25 + 0.3,
        opacities=torch.full((n,), 0.8),
        colors=torch.rand(n, 3, generator=g),
    )


VIEWMAT = look_at_viewmat((0.2, -0.1, -3.0), (0.0, 0.0, 0.0), dtype=torch.float32)


def _render(K, width, height):
    s = _scene()
    out = splat.rasterize(
        s["means"],
        s["quats"],
        s["scales"],
        s["opacities"],
        s["colors"],
        VIEWMAT,
        torch.as_tensor(K, dtype=torch.float32),
        width,
        height,
        background=torch.ones(3),
        backend="cpu",
    )
    return out.rgb.clamp(0, 1).numpy()  # [H, W, 3]


def _distorted_image(model):
    """The scene as the distorted camera sees it: for each distorted pixel
    centre, sample a pinhole render (2x supersampled) at the undistorted point."""
    s, pad = 2, 24  # twice the resolution (less resampling blur), a margin around the field of view
    Kp = np.array([[FX * s, 0, (CX + pad) * s], [0, FY * s, (CY + pad) * s], [0, 0, 1.0]])
    src = _render(Kp, (W + 2 * pad) * s, (H + 2 * pad) * s)
    jj, ii = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    x, y = inverse(model, CAMERAS[model], jj, ii)
    mx = (FX * x + CX + pad) * s - 0.5  # OpenCV pixel convention of the source
    my = (FY * y + CY + pad) * s - 0.5
    assert mx.min() > 0 and my.min() > 0 and mx.max() < src.shape[1] - 1 and my.max() < src.shape[0] - 1
    out = cv2.remap(
        src.astype(np.float32),
        mx.astype(np.float32),
        my.astype(np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )
    return (np.clip(out, 0, 1) * 255 + 0.5).astype(np.uint8)


def _write_colmap(root: Path, model: str, img: np.ndarray):
    (root / "images").mkdir(parents=True)
    (root / "sparse" / "0").mkdir(parents=True)
    Image.fromarray(img).save(root / "images" / "a.png")
    V = VIEWMAT.double().numpy()
    from fixtures_data import rotmat_to_qvec

    q, t = rotmat_to_qvec(V[:3, :3]), V[:3, 3]
    (root / "sparse/0/cameras.txt").write_text(
        f"1 {model} {W} {H} " + " ".join(repr(float(x)) for x in CAMERAS[model]) + "\n"
    )
    (root / "sparse/0/images.txt").write_text("1 " + " ".join(repr(float(x)) for x in [*q, *t]) + " 1 a.png\n\n")
    (root / "sparse/0/points3D.txt").write_text("")
    return root


def _write_transforms(root: Path, model: str, img: np.ndarray, **extra):
    (root / "images").mkdir(parents=True)
    Image.fromarray(img).save(root / "images" / "a.png")
    p = CAMERAS[model]
    meta = {"fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3], "w": W, "h": H}
    if model == "OPENCV":
        meta.update(camera_model="OPENCV", k1=p[4], k2=p[5], p1=p[6], p2=p[7])
    elif model == "OPENCV_FISHEYE":
        meta.update(camera_model="OPENCV_FISHEYE", k1=p[4], k2=p[5], k3=p[6], k4=p[7])
    c2w_gl = np.linalg.inv(VIEWMAT.double().numpy()) @ np.diag([1.0, -1, -1, 1])
    meta.update(extra)
    meta["frames"] = [{"file_path": "images/a.png", "transform_matrix": c2w_gl.tolist()}]
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


# Tolerances: the loaded image has been resampled twice (distortion here,
# undistortion in the loader, both bilinear) and quantised to 8 bits twice;
# on this smooth scene that measures 0.0012 mean and 0.006 max abs error
# (every model).  The test allows 0.004 / 0.03 (~3-5x) and checks that
# ignoring the distortion is far worse (> 5x the mean), so it cannot pass by
# accident.
MEAN_TOL, MAX_TOL = 0.004, 0.03


def _check_against_render(frame, distorted):
    K = frame.K.double().numpy()
    assert frame.mask is None  # blank_pixels=0: only valid pixels kept
    truth = _render(K, frame.width, frame.height)
    got = frame.image.numpy()
    err = np.abs(got - truth)
    e = err[2:-2, 2:-2]  # the outermost pixels sample beyond the source's last pixel centre
    assert e.mean() < MEAN_TOL and e.max() < MAX_TOL, (e.mean(), e.max())
    # Not undistorting at all would be much worse:
    naive = _render(np.array([[FX, 0, CX], [0, FY, CY], [0, 0, 1]]), W, H)
    assert np.abs(distorted / 255.0 - naive).mean() > 5 * e.mean()
    return e


@pytest.mark.parametrize("model", list(CAMERAS))
def test_colmap_distorted_camera_is_undistorted(tmp_path, model):
    img = _distorted_image(model)
    scene = load_scene(_write_colmap(tmp_path / "s", model, img), test_every=0, cache_dir=tmp_path / "cache")
    f = scene.train[0]
    new = undistorted_camera(LensCamera(model, W, H, CAMERAS[model]))
    fx, fy, cx, cy = new.fxfycxcy()
    assert (f.width, f.height) == (new.width, new.height)
    np.testing.assert_allclose(f.K.numpy(), [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], rtol=1e-6)
    _check_against_render(f, img)


@pytest.mark.parametrize("model", ["OPENCV", "OPENCV_FISHEYE"])
def test_transforms_json_distorted_camera_is_undistorted(tmp_path, model):
    img = _distorted_image(model)
    scene = load_scene(_write_transforms(tmp_path / "s", model, img), test_every=0, cache_dir=tmp_path / "c")
    assert scene.layout == "transforms"
    _check_against_render(scene.train[0], img)


def test_instant_ngp_distortion_without_camera_model(tmp_path):
    """instant-ngp writes k1 k2 p1 p2 without camera_model: that is OPENCV."""
    img = _distorted_image("OPENCV")
    root = _write_transforms(tmp_path / "s", "OPENCV", img)
    meta = json.loads((root / "transforms.json").read_text())
    del meta["camera_model"]
    (root / "transforms.json").write_text(json.dumps(meta))
    _check_against_render(load_scene(root, test_every=0, cache_dir=tmp_path / "c").train[0], img)


def test_crop_policy_blank_pixels(tmp_path):
    cam = LensCamera("OPENCV", W, H, CAMERAS["OPENCV"])
    inner, outer = undistorted_camera(cam, 0.0), undistorted_camera(cam, 1.0)
    # Barrel distortion (k1 < 0): the undistorted image is larger than the source
    # keeping every pixel, smaller keeping only valid pixels.
    assert inner.width < outer.width and inner.height < outer.height
    assert inner.params[:2] == outer.params[:2] == (FX, FY)  # focal lengths kept
    # blank_pixels=1: all four source corners land inside the new image
    corners = np.array([[0.0, 0.0], [W, 0.0], [0.0, H], [W, H]])
    from splat.data.undistort import _undistort_to_normalised

    n = _undistort_to_normalised(cam, np.clip(corners, 0.5, [W - 0.5, H - 0.5]))
    ofx, ofy, ocx, ocy = outer.fxfycxcy()
    u, v = ofx * n[:, 0] + ocx, ofy * n[:, 1] + ocy
    assert np.all((u >= -1) & (u <= outer.width + 1) & (v >= -1) & (v <= outer.height + 1))
    # ... and the loaded image has a blank border (mask 0, composited over the background).
    img = _distorted_image("OPENCV")
    root = _write_colmap(tmp_path / "s", "OPENCV", img)
    f = load_scene(root, test_every=0, cache_dir=tmp_path / "c", blank_pixels=1.0).train[0]
    assert f.mask is not None and float(f.mask.min()) == 0.0 and float(f.mask.max()) == 1.0
    assert torch.allclose(f.image[f.mask == 0], torch.ones(3))  # white background
    # scales are clamped to [min_scale, max_scale]
    assert undistorted_camera(cam, 1.0, max_scale=1.0).width == W


def test_cache_reused_and_invalidated(tmp_path):
    img = _distorted_image("OPENCV")
    root = _write_colmap(tmp_path / "s", "OPENCV", img)
    cache = tmp_path / "cache"
    a = load_scene(root, test_every=0, cache_dir=cache).train[0]
    files = sorted((cache / "undistorted").iterdir())
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    b = load_scene(root, test_every=0, cache_dir=cache).train[0]
    assert torch.equal(a.image, b.image)
    assert sorted((cache / "undistorted").iterdir()) == files and files[0].stat().st_mtime_ns == stamp
    # Editing the image (new contents and mtime) makes a new entry.
    Image.fromarray(255 - img).save(root / "images" / "a.png")
    st = (root / "images" / "a.png").stat()
    os.utime(root / "images" / "a.png", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    c = load_scene(root, test_every=0, cache_dir=cache).train[0]
    assert len(list((cache / "undistorted").iterdir())) == 2
    assert not torch.equal(a.image, c.image)
    # The environment variable picks the default cache folder.
    os.environ["SPLAT_CACHE_DIR"] = str(tmp_path / "env_cache")
    try:
        load_scene(root, test_every=0)
    finally:
        del os.environ["SPLAT_CACHE_DIR"]
    assert len(list((tmp_path / "env_cache" / "undistorted").iterdir())) == 1


# ------------------------------------------------- implausible distortion
# Real lenses, which must stay accepted (blank_pixels 0 and 1):
REAL_CAMERAS = {
    # instant-ngp's fox (transforms.json, OPENCV): mild pincushion, portrait
    "fox": LensCamera(
        "OPENCV", 1080, 1920, (1375.52, 1374.49, 554.558, 965.268, 0.0578421, -0.0805099, -0.000980296, 0.00015575)
    ),
    # GoPro wide mode calibrated as OPENCV: strong barrel
    "gopro_opencv": LensCamera("OPENCV", 1920, 1080, (880.0, 880.0, 960.0, 540.0, -0.26, 0.07, 0.0, 0.0)),
    # GoPro as a fisheye
    "gopro_fisheye": LensCamera("OPENCV_FISHEYE", 1920, 1080, (890.0, 890.0, 960.0, 540.0, 0.04, 0.01, 0.0, 0.0)),
    # an equidistant 180-degree (across the width) fisheye
    "fisheye_180": LensCamera("OPENCV_FISHEYE", 1000, 800, (1000 / np.pi, 1000 / np.pi, 500.0, 400.0, 0, 0, 0, 0)),
    # telephoto pincushion
    "pincushion": LensCamera("RADIAL", 1000, 800, (1000.0, 500.0, 400.0, 0.3, 0.0)),
}


@pytest.mark.parametrize("name", list(REAL_CAMERAS))
@pytest.mark.parametrize("blank", [0.0, 1.0])
def test_real_distortions_are_accepted(name, blank):
    from splat.data.undistort import MIN_VALID_AREA, valid_area

    cam = REAL_CAMERAS[name]
    new = undistorted_camera(cam, blank)
    assert valid_area(cam, new) > 10 * MIN_VALID_AREA  # far from the threshold


def test_valid_area_measures_the_valid_pixels():
    cam = LensCamera("OPENCV", W, H, CAMERAS["OPENCV"])
    from splat.data.undistort import undistortion_maps, valid_area

    for blank in (0.0, 1.0):
        new = undistorted_camera(cam, blank)
        mx, my = undistortion_maps(cam, new)  # OpenCV convention: the source spans [-0.5, W - 0.5]
        inside = (mx >= -0.5) & (mx <= W - 0.5) & (my >= -0.5) & (my <= H - 0.5)
        assert valid_area(cam, new) == pytest.approx(inside.sum() / (W * H), abs=0.01)
        # blank_pixels=1 makes blank pixels (barrel distortion), which do not count
        assert inside.all() == (blank == 0.0)


@pytest.mark.parametrize("k1", [1e30, 1e3])
def test_absurd_distortion_is_refused(tmp_path, k1):
    """OPENCV k1 = 1e30 undistorts to a 12x12 frame with no valid pixel (k1 =
    1000: 2% of the source's area); training would fit a blank frame."""
    size, p = 60, (60.0, 60.0, 30.0, 30.0, k1, 0.0, 0.0, 0.0)
    img = np.full((size, size, 3), 128, np.uint8)
    with pytest.raises(ValueError, match="valid pixels"):
        undistorted_camera(LensCamera("OPENCV", size, size, p), 1.0)
    from fixtures_data import rotmat_to_qvec

    from splat.data.types import DataError

    root = tmp_path / "colmap"
    (root / "images").mkdir(parents=True)
    (root / "sparse" / "0").mkdir(parents=True)
    Image.fromarray(img).save(root / "images" / "a.png")
    V = VIEWMAT.double().numpy()
    (root / "sparse/0/cameras.txt").write_text(f"3 OPENCV {size} {size} " + " ".join(map(repr, p)) + "\n")
    (root / "sparse/0/images.txt").write_text(
        "1 " + " ".join(repr(float(x)) for x in [*rotmat_to_qvec(V[:3, :3]), *V[:3, 3]]) + " 3 a.png\n\n"
    )
    (root / "sparse/0/points3D.txt").write_text("")
    with pytest.raises(
        DataError,
        match=r"images/a\.png: cannot undistort \(.*cameras\.txt: camera 3\): "
        r"camera .*OPENCV.*valid pixels",
    ):
        load_scene(root, test_every=0, cache_dir=tmp_path / "c")

    root = tmp_path / "transforms"
    (root / "images").mkdir(parents=True)
    Image.fromarray(img).save(root / "images" / "a.png")
    c2w_gl = (np.linalg.inv(VIEWMAT.double().numpy()) @ np.diag([1.0, -1, -1, 1])).tolist()
    meta = {
        "fl_x": p[0],
        "fl_y": p[1],
        "cx": p[2],
        "cy": p[3],
        "w": size,
        "h": size,
        "k1": k1,
        "frames": [{"file_path": "images/a.png", "transform_matrix": c2w_gl}],
    }
    (root / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(
        DataError,
        match=r"images/a\.png: cannot undistort \(transforms\.json: frames\[0\]\): "
        r".*valid pixels",
    ):
        load_scene(root, test_every=0, cache_dir=tmp_path / "c")
