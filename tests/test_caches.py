"""The on-disk caches of splat.data (issue 27): undistorted images
(splat/data/undistort.py) and triangulated points (splat/data/triangulate.py).

A cache entry must follow its source's content (not its modification time),
and an entry that cannot be read back is recomputed with a one-line warning,
never an error that repeats on every run.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("cv2")

from splat.data.types import Frame
from splat.data.undistort import LensCamera, load_camera_image

W, H = 40, 30
CAM = LensCamera("OPENCV", W, H, (40.0, 40.0, 20.0, 15.0, -0.1, 0.01, 0.0, 0.0))


def _load(path, cache):
    img, mask, _ = load_camera_image(path, CAM, 1, torch.zeros(3), cache)
    return img


def _write_bmp(path, value):
    # BMP: the file size depends only on the image size, as in the report.
    Image.fromarray(np.full((H, W, 3), value, np.uint8)).save(path, format="BMP")


# ------------------------------------------------- undistortion cache
def test_undistortion_cache_follows_the_content_not_the_mtime(tmp_path):
    """A reproducible tarball, ``cp -p`` or ``touch -r`` change an image and
    keep its size and modification time."""
    src, cache = tmp_path / "a.bmp", tmp_path / "cache"
    _write_bmp(src, 207)  # 0.81
    st = src.stat()
    assert float(_load(src, cache).mean()) == pytest.approx(207 / 255, abs=1e-3)
    _write_bmp(src, 48)  # 0.19, same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size and src.stat().st_mtime_ns == st.st_mtime_ns
    assert float(_load(src, cache).mean()) == pytest.approx(48 / 255, abs=1e-3)
    # The same content at another path shares the entry.
    other = tmp_path / "b.bmp"
    _write_bmp(other, 48)
    _load(other, cache)
    assert len(list((cache / "undistorted").iterdir())) == 2


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "wrong_size"])
def test_corrupt_undistortion_cache_entry_is_recomputed(tmp_path, capsys, damage):
    src, cache = tmp_path / "a.bmp", tmp_path / "cache"
    _write_bmp(src, 207)
    good = _load(src, cache)
    (entry,) = (cache / "undistorted").iterdir()
    data = entry.read_bytes()
    if damage == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x89PNG not really" * 10)
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a readable image of the wrong size
        Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(entry, format="PNG")
    capsys.readouterr()
    assert torch.equal(_load(src, cache), good)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: corrupt undistortion cache entry" in err
    assert str(entry) in err and "recomputed" in err
    # The entry is repaired: no warning the next time.
    assert torch.equal(_load(src, cache), good) and capsys.readouterr().err == ""


def test_undistorted_image_smaller_than_downscale_names_the_source(tmp_path):
    from splat.data.types import DataError

    src = tmp_path / "a.bmp"
    _write_bmp(src, 207)
    with pytest.raises(DataError, match=r"a\.bmp: undistorted image of \d+x\d+ pixels is smaller than downscale"):
        load_camera_image(src, CAM, 64, torch.zeros(3), tmp_path / "cache")


# ------------------------------------------------- triangulation cache
from splat.data.triangulate import pycolmap_available  # noqa: E402

needs_pycolmap = pytest.mark.skipif(not pycolmap_available(), reason="triangulate_scene needs pycolmap")


def _frames():
    g = torch.Generator().manual_seed(0)
    K = torch.tensor([[20.0, 0, 8], [0, 20.0, 6], [0, 0, 1]])
    return [
        Frame(
            stem=f"f{i}",
            image_path=None,
            image=torch.rand(12, 16, 3, generator=g),
            mask=None,
            viewmat=torch.eye(4),
            K=K,
            width=16,
            height=12,
        )
        for i in range(2)
    ]


XYZ = np.arange(12, dtype=np.float64).reshape(4, 3)
RGB = np.linspace(0, 1, 12).reshape(4, 3)


@pytest.fixture
def fake_triangulation(monkeypatch):
    """triangulate_frames replaced by a counter returning XYZ, RGB."""
    import splat.data.triangulate as tri

    calls = []

    def fake(frames, work, verbose=False):
        calls.append(len(frames))
        return XYZ.copy(), RGB.copy()

    monkeypatch.setattr(tri, "triangulate_frames", fake)
    return calls


def _corrupt(path, damage):
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "not_a_zip":
        path.write_bytes(b"garbage" * 20)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "missing_key":
        np.savez(path, xyz=XYZ.astype(np.float32))
    elif damage == "wrong_shape":
        np.savez(path, xyz=np.zeros((4, 2), np.float32), rgb=np.zeros((4, 2), np.float32))
    elif damage == "mismatched_lengths":
        np.savez(path, xyz=np.zeros((4, 3), np.float32), rgb=np.zeros((3, 3), np.float32))
    elif damage == "nan":
        np.savez(path, xyz=np.full((4, 3), np.nan, np.float32), rgb=RGB.astype(np.float32))
    elif damage == "pickled":
        np.savez(path, xyz=np.array([object()], dtype=object), rgb=RGB.astype(np.float32))


@needs_pycolmap
@pytest.mark.parametrize(
    "damage", ["truncated", "not_a_zip", "empty", "missing_key", "wrong_shape", "mismatched_lengths", "nan", "pickled"]
)
def test_corrupt_triangulation_cache_entry_is_recomputed(tmp_path, capsys, fake_triangulation, damage):
    from splat.data.triangulate import triangulate_scene

    frames = _frames()
    pts, cols = triangulate_scene(frames, cache_dir=tmp_path)
    (entry,) = (tmp_path / "triangulated").iterdir()
    assert fake_triangulation == [2]
    _corrupt(entry, damage)
    capsys.readouterr()
    pts2, cols2 = triangulate_scene(frames, cache_dir=tmp_path)
    assert fake_triangulation == [2, 2]  # recomputed
    assert torch.equal(pts2, pts) and torch.equal(cols2, cols)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"warning: corrupt triangulation cache entry {entry}" in err
    # Repaired: read from the cache, silently.
    triangulate_scene(frames, cache_dir=tmp_path)
    assert fake_triangulation == [2, 2] and capsys.readouterr().err == ""


@needs_pycolmap
def test_triangulation_cache_write_is_atomic(tmp_path, monkeypatch, fake_triangulation):
    """A run killed while writing the entry leaves neither a partial entry nor a temp file."""
    from splat.data.triangulate import triangulate_scene

    real_savez = np.savez

    def killed(f, **arrays):
        f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt  # what SIGINT raises mid-write

    monkeypatch.setattr(np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        triangulate_scene(_frames(), cache_dir=tmp_path)
    assert list((tmp_path / "triangulated").iterdir()) == []
    monkeypatch.setattr(np, "savez", real_savez)
    pts, _ = triangulate_scene(_frames(), cache_dir=tmp_path)
    (entry,) = (tmp_path / "triangulated").iterdir()
    assert zipfile.is_zipfile(entry) and torch.equal(pts, torch.from_numpy(XYZ).float())
