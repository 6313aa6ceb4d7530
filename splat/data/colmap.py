"""COLMAP sparse models (text and binary) -> :class:`SceneData`.

Layout on disk::

    <scene>/images/<name>                   the images named in images.{txt,bin}
    <scene>/sparse/0/cameras.{bin,txt}      (or <scene>/sparse/cameras.*)
    <scene>/sparse/0/images.{bin,txt}
    <scene>/sparse/0/points3D.{bin,txt}

For each of the three files the binary one is used if present, else the text
one.  The readers below are our own (no pycolmap), written from COLMAP's
documented formats; every problem is reported as :class:`DataError` naming the
file (and, for text, the line).

COLMAP already stores world -> camera poses in the OpenCV convention
(``qvec = (w, x, y, z)``, ``x_cam = R(q) x_world + t``), so ``viewmat`` is
just ``[[R, t], [0, 1]]``.  Pinhole cameras (``PINHOLE``: fx fy cx cy,
``SIMPLE_PINHOLE``: f cx cy) are used as they are; ``SIMPLE_RADIAL``,
``RADIAL``, ``OPENCV``, ``FULL_OPENCV`` and ``OPENCV_FISHEYE`` cameras are
undistorted at load into pinhole cameras, with an on-disk cache (see
:mod:`splat.data.undistort` for the crop policy and the cache folder).
COLMAP's principal point is in the same pixel-centre convention as ours (the
centre of the top-left pixel is (0.5, 0.5)), so it is kept exactly.

Train/test split: images sorted by name; index ``% test_every == 0`` goes to
test, the rest to train (the "LLFF hold-out" of 3DGS).  This is applied to the
images present in the model whatever their names, so a scene whose model
holds only ``train_*`` views (e.g. the shared dev scene) gets a test split
carved out of those.  ``test_every <= 0`` puts everything in train; zero
training images (one image, ``test_every=8``) is refused with the hint
``data.test_every=0``.  Two images of the same name (two poses for one
file) are refused, naming the file and the name.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from .types import (
    BackgroundLike,
    DataError,
    Frame,
    SceneData,
    check_intrinsics,
    check_points,
    check_pose,
    first_repeat,
    holdout_split,
    image_size,
    parse_background,
    scaled_K,
)
from .undistort import DISTORTED_MODELS, PINHOLE_MODELS, LensCamera, load_camera_image

__all__ = [
    "ColmapCamera",
    "ColmapImage",
    "CAMERA_MODELS",
    "find_sparse_dir",
    "read_model",
    "read_cameras_text",
    "read_cameras_binary",
    "read_images_text",
    "read_images_binary",
    "read_points3d_text",
    "read_points3d_binary",
    "qvec_to_rotmat",
    "load_colmap",
]

#: COLMAP camera models: id -> (name, number of params).
CAMERA_MODELS: dict[int, tuple[str, int]] = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
}
_MODEL_PARAMS_BY_NAME = {name: n for name, n in CAMERA_MODELS.values()}
_SUPPORTED_MODELS = PINHOLE_MODELS + DISTORTED_MODELS


@dataclass
class ColmapCamera:
    id: int
    model: str  # e.g. "PINHOLE"
    width: int
    height: int
    params: np.ndarray  # [P] float64


@dataclass
class ColmapImage:
    id: int
    qvec: np.ndarray  # [4] float64, (w, x, y, z), world -> camera rotation
    tvec: np.ndarray  # [3] float64, world -> camera translation
    camera_id: int
    name: str  # path relative to images/


def qvec_to_rotmat(q: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) -> rotation matrix ``[3, 3]`` (normalises first)."""
    q = np.asarray(q, dtype=np.float64)
    n = np.linalg.norm(q)
    if not np.isfinite(n) or n < 1e-12:
        raise ValueError(f"quaternion {q.tolist()} has zero or non-finite norm")
    w, x, y, z = q / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


# --------------------------------------------------------------------------
# text format
# --------------------------------------------------------------------------


def _text_lines(path: Path):
    """Yield ``(line_number, stripped_line)`` for every line, comments dropped
    (blank lines are kept: images.txt needs them)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from e
    for i, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if s.startswith("#"):
            continue
        yield i, s


def _num(path: Path, lineno: int, tok: str, kind=float, what: str = "value"):
    try:
        v = kind(tok)
    except ValueError:
        raise DataError(f"{path}: line {lineno}: malformed {what} {tok!r}") from None
    if kind is float and not np.isfinite(v):
        raise DataError(f"{path}: line {lineno}: non-finite {what} {tok!r}")
    return v


def read_cameras_text(path: Path) -> dict[int, ColmapCamera]:
    """cameras.txt: ``CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]`` per line."""
    path = Path(path)
    cams: dict[int, ColmapCamera] = {}
    for ln, s in _text_lines(path):
        if not s:
            continue
        tok = s.split()
        if len(tok) < 4:
            raise DataError(
                f"{path}: line {ln}: malformed camera line (expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]): {s!r}"
            )
        cid = _num(path, ln, tok[0], int, "camera id")
        model = tok[1]
        w = _num(path, ln, tok[2], int, "width")
        h = _num(path, ln, tok[3], int, "height")
        params = np.array([_num(path, ln, t, float, "camera parameter") for t in tok[4:]])
        expected = _MODEL_PARAMS_BY_NAME.get(model)
        if expected is not None and len(params) != expected:
            raise DataError(f"{path}: line {ln}: camera model {model} takes {expected} parameters, got {len(params)}")
        if cid in cams:
            raise DataError(f"{path}: line {ln}: duplicate camera id {cid}")
        cams[cid] = ColmapCamera(cid, model, w, h, params)
    return cams


def read_images_text(path: Path) -> dict[int, ColmapImage]:
    """images.txt: two lines per image,
    ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` then ``POINTS2D[]`` as
    ``(X, Y, POINT3D_ID)`` triples (possibly an empty line).  The 2D points
    are checked for shape but not kept."""
    path = Path(path)
    images: dict[int, ColmapImage] = {}
    lines = list(_text_lines(path))
    i = 0
    while i < len(lines):
        ln, s = lines[i]
        i += 1
        if not s:
            continue  # blank line between records or at the end
        tok = s.split()
        if len(tok) < 10:
            raise DataError(
                f"{path}: line {ln}: malformed image line "
                f"(expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME): {s!r}"
            )
        iid = _num(path, ln, tok[0], int, "image id")
        q = np.array([_num(path, ln, t, float, "quaternion component") for t in tok[1:5]])
        t = np.array([_num(path, ln, t, float, "translation component") for t in tok[5:8]])
        cid = _num(path, ln, tok[8], int, "camera id")
        name = " ".join(tok[9:])
        # The next line is this image's POINTS2D line (maybe empty).
        if i < len(lines):
            ln2, s2 = lines[i]
            i += 1
            if s2 and len(s2.split()) % 3 != 0:
                raise DataError(
                    f"{path}: line {ln2}: malformed POINTS2D line (expected X Y POINT3D_ID triples); "
                    "images.txt needs two lines per image, the second possibly empty"
                )
        if iid in images:
            raise DataError(f"{path}: line {ln}: duplicate image id {iid}")
        images[iid] = ColmapImage(iid, q, t, cid, name)
    return images


def read_points3d_text(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """points3D.txt: ``POINT3D_ID X Y Z R G B ERROR TRACK[]`` per line.

    Returns ``(xyz [M, 3] float64, rgb [M, 3] uint8)``.
    """
    path = Path(path)
    xyz, rgb = [], []
    for ln, s in _text_lines(path):
        if not s:
            continue
        tok = s.split()
        if len(tok) < 8 or (len(tok) - 8) % 2 != 0:
            raise DataError(
                f"{path}: line {ln}: malformed point line (expected POINT3D_ID X Y Z R G B ERROR TRACK[]): {s[:80]!r}"
            )
        _num(path, ln, tok[0], int, "point id")
        xyz.append([_num(path, ln, t, float, "coordinate") for t in tok[1:4]])
        c = [_num(path, ln, t, int, "colour") for t in tok[4:7]]
        if any(v < 0 or v > 255 for v in c):
            raise DataError(f"{path}: line {ln}: colour {c} out of range 0..255")
        try:
            float(tok[7])
        except ValueError:
            raise DataError(f"{path}: line {ln}: malformed reprojection error {tok[7]!r}") from None
        rgb.append(c)
    return (
        np.asarray(xyz, dtype=np.float64).reshape(-1, 3),
        np.asarray(rgb, dtype=np.uint8).reshape(-1, 3),
    )


# --------------------------------------------------------------------------
# binary format (little endian)
# --------------------------------------------------------------------------


class _BinReader:
    """Bounds-checked little-endian reader: reading past the end raises
    :class:`DataError` naming the file instead of ``struct.error``."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.buf = path.read_bytes()
        except OSError as e:
            raise DataError(f"{path}: cannot read ({e})") from e
        self.pos = 0

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise DataError(
                f"{self.path}: truncated or corrupt binary model: needs {n} more bytes for {what} "
                f"at offset {self.pos}, but the file has {len(self.buf)} bytes"
            )

    def unpack(self, fmt: str, what: str) -> tuple:
        fmt = "<" + fmt
        n = struct.calcsize(fmt)
        self._need(n, what)
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        self._need(n, what)
        self.pos += n

    def cstring(self, what: str) -> str:
        end = self.buf.find(b"\x00", self.pos)
        if end < 0:
            raise DataError(f"{self.path}: truncated or corrupt binary model: unterminated {what} at offset {self.pos}")
        raw = self.buf[self.pos : end]
        self.pos = end + 1
        return raw.decode("utf-8", errors="replace")

    def count(self, what: str, min_record_bytes: int) -> int:
        """A uint64 element count, sanity-checked against the bytes left."""
        (n,) = self.unpack("Q", what)
        if n * min_record_bytes > len(self.buf) - self.pos:
            raise DataError(
                f"{self.path}: truncated or corrupt binary model: {what} = {n} needs at least "
                f"{n * min_record_bytes} bytes, only {len(self.buf) - self.pos} left at offset {self.pos}"
            )
        return n

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise DataError(
                f"{self.path}: corrupt binary model: {len(self.buf) - self.pos} unexpected trailing bytes "
                f"at offset {self.pos}"
            )


def read_cameras_binary(path: Path) -> dict[int, ColmapCamera]:
    """cameras.bin: ``uint64 n``, then per camera ``int32 id, int32 model_id,
    uint64 width, uint64 height, float64 params[num_params(model)]``."""
    path = Path(path)
    r = _BinReader(path)
    n = r.count("number of cameras", 24)
    cams: dict[int, ColmapCamera] = {}
    for _ in range(n):
        cid, model_id, w, h = r.unpack("iiQQ", "camera header")
        if model_id not in CAMERA_MODELS:
            raise DataError(f"{path}: camera {cid}: unknown camera model id {model_id} (corrupt file?)")
        model, nparams = CAMERA_MODELS[model_id]
        params = np.array(r.unpack("d" * nparams, f"camera {cid} parameters"), dtype=np.float64)
        if not np.all(np.isfinite(params)):
            raise DataError(f"{path}: camera {cid}: non-finite camera parameters {params.tolist()}")
        if cid in cams:
            raise DataError(f"{path}: duplicate camera id {cid}")
        cams[cid] = ColmapCamera(cid, model, int(w), int(h), params)
    r.finish()
    return cams


def read_images_binary(path: Path) -> dict[int, ColmapImage]:
    """images.bin: ``uint64 n``, then per image ``int32 id, float64 qvec[4],
    float64 tvec[3], int32 camera_id, char name[] (NUL-terminated),
    uint64 num_points2D, (float64 x, float64 y, int64 point3D_id)[num_points2D]``."""
    path = Path(path)
    r = _BinReader(path)
    n = r.count("number of images", 4 + 56 + 4 + 1 + 8)
    images: dict[int, ColmapImage] = {}
    for _ in range(n):
        vals = r.unpack("i7di", "image header")
        iid, q, t, cid = vals[0], np.array(vals[1:5]), np.array(vals[5:8]), vals[8]
        name = r.cstring(f"name of image {iid}")
        npts = r.count(f"number of 2D points of image {iid}", 24)
        r.skip(24 * npts, f"2D points of image {iid}")
        if not (np.all(np.isfinite(q)) and np.all(np.isfinite(t))):
            raise DataError(f"{path}: image {iid} ({name}): non-finite pose")
        if iid in images:
            raise DataError(f"{path}: duplicate image id {iid}")
        images[iid] = ColmapImage(iid, q, t, cid, name)
    r.finish()
    return images


def read_points3d_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """points3D.bin: ``uint64 n``, then per point ``uint64 id, float64 xyz[3],
    uint8 rgb[3], float64 error, uint64 track_length,
    (int32 image_id, int32 point2D_idx)[track_length]``.

    Returns ``(xyz [M, 3] float64, rgb [M, 3] uint8)``.
    """
    path = Path(path)
    r = _BinReader(path)
    n = r.count("number of points", 51)
    xyz = np.empty((n, 3), dtype=np.float64)
    rgb = np.empty((n, 3), dtype=np.uint8)
    for k in range(n):
        vals = r.unpack("Q3d3Bd", f"point {k}")
        xyz[k] = vals[1:4]
        rgb[k] = vals[4:7]
        track = r.count(f"track length of point {k}", 8)
        r.skip(8 * track, f"track of point {k}")
    r.finish()
    return xyz, rgb


# --------------------------------------------------------------------------
# model -> SceneData
# --------------------------------------------------------------------------


def find_sparse_dir(root: Path) -> Optional[Path]:
    """``root/sparse/0`` if it exists, else ``root/sparse`` if it holds a
    cameras file, else ``None``."""
    root = Path(root)
    if (root / "sparse" / "0").is_dir():
        return root / "sparse" / "0"
    sp = root / "sparse"
    if sp.is_dir() and any((sp / f"cameras.{e}").is_file() for e in ("bin", "txt")):
        return sp
    return None


def _model_file(sparse: Path, stem: str) -> Path:
    for ext in ("bin", "txt"):
        p = sparse / f"{stem}.{ext}"
        if p.is_file():
            return p
    raise DataError(f"{sparse / (stem + '.bin')}: missing (no {stem}.bin or {stem}.txt in {sparse})")


def read_model(
    sparse: Path,
) -> tuple[dict[int, ColmapCamera], dict[int, ColmapImage], np.ndarray, np.ndarray, dict[str, Path]]:
    """Read a COLMAP model folder.

    Returns ``(cameras, images, xyz [M, 3] float64, rgb [M, 3] uint8,
    files)`` where ``files`` maps ``"cameras"/"images"/"points3D"`` to the
    paths actually read.
    """
    sparse = Path(sparse)
    files = {s: _model_file(sparse, s) for s in ("cameras", "images", "points3D")}

    def pick(stem, text_reader, bin_reader):
        p = files[stem]
        return bin_reader(p) if p.suffix == ".bin" else text_reader(p)

    cams = pick("cameras", read_cameras_text, read_cameras_binary)
    images = pick("images", read_images_text, read_images_binary)
    xyz, rgb = pick("points3D", read_points3d_text, read_points3d_binary)
    return cams, images, xyz, rgb, files


def _viewmat(q: np.ndarray, t: np.ndarray) -> np.ndarray:
    V = np.eye(4)
    V[:3, :3] = qvec_to_rotmat(q)
    V[:3, 3] = t
    return V  # [4, 4] float64


def _unsupported_model_message(cam_file: Path, cam: ColmapCamera, image_name: str) -> str:
    try:
        import pycolmap  # noqa: F401

        extra = " (or pycolmap.undistort_images)"
    except Exception:
        extra = ""
    return (
        f"{cam_file}: camera {cam.id} (used by image {image_name!r}) has camera model {cam.model}, "
        f"which is unsupported: only {', '.join(_SUPPORTED_MODELS)} are. Undistort the images first "
        f"with `colmap image_undistorter --image_path <images> --input_path <sparse/0> "
        f"--output_path <out> --output_type COLMAP`{extra} and load its output folder."
    )


def load_colmap(
    path: Path,
    downscale: int = 1,
    background: BackgroundLike = (1.0, 1.0, 1.0),
    test_every: int = 8,
    cache_dir: Optional[Union[str, Path]] = None,
    blank_pixels: float = 0.0,
) -> SceneData:
    """Load a COLMAP scene folder (see the module docstring for the layout).

    Args:
        path: the scene folder (holding ``images/`` and ``sparse/``).
        downscale: integer factor; images are area-averaged and K divided.
        background: RGB in [0, 1] that RGBA images are composited over.
        test_every: every ``test_every``-th image (name-sorted, index 0
            included) goes to test; ``<= 0`` for no test split.
        cache_dir, blank_pixels: undistortion of non-pinhole cameras (see
            :mod:`splat.data.undistort`).

    Raises:
        DataError: for any missing, unreadable or inconsistent file.
    """
    root = Path(path)
    sparse = find_sparse_dir(root)
    if sparse is None:
        raise DataError(f"{root}: no COLMAP model (expected {root / 'sparse' / '0'} with cameras/images/points3D)")
    bg = parse_background(background)
    cams, images, xyz, rgb, files = read_model(sparse)
    check_points(str(files["points3D"]), xyz)

    if not images:
        raise DataError(f"{files['images']}: the model has zero images, so zero usable cameras")
    # Two views of one image file (different poses: a merged or corrupt model)
    # would be trained on twice, or be both a train and a test view.
    twice = first_repeat(os.path.normpath(im.name) for im in sorted(images.values(), key=lambda x: x.id))
    if twice is not None:
        ids = [im.id for im in images.values() if os.path.normpath(im.name) == twice]
        raise DataError(
            f"{files['images']}: image ids {' and '.join(map(str, sorted(ids)))} are both named "
            f"{twice!r} (two poses for one image); remove the duplicate"
        )

    image_dir = root / "images"
    frames: list[Frame] = []
    for im in sorted(images.values(), key=lambda x: x.name):
        cam = cams.get(im.camera_id)
        if cam is None:
            raise DataError(
                f"{files['images']}: image {im.name!r} refers to camera id {im.camera_id}, "
                f"which is not in {files['cameras']} (inconsistent model)"
            )
        if cam.model not in _SUPPORTED_MODELS:
            raise DataError(_unsupported_model_message(files["cameras"], cam, im.name))
        lens = LensCamera(cam.model, cam.width, cam.height, tuple(float(v) for v in cam.params))
        fx, fy, cx, cy = lens.fxfycxcy()
        check_intrinsics(f"{files['cameras']}: camera {cam.id}", fx, fy, cx, cy)

        ipath = image_dir / im.name
        if not ipath.is_file():
            raise DataError(f"{ipath}: image file not found (named by {files['images']})")
        try:
            pose = _viewmat(im.qvec, im.tvec)
        except ValueError as e:  # a zero quaternion
            raise DataError(f"{files['images']}: image {im.name!r}: {e}") from None
        viewmat = check_pose(f"{files['images']}: image {im.name!r}", pose)

        # Check the size before decoding the whole image (PIL reads the header lazily).
        _check_size(ipath, cam, files["cameras"])
        img, mask, (fx, fy, cx, cy) = load_camera_image(
            ipath, lens, downscale, bg, cache_dir, blank_pixels, camera_name=f"{files['cameras']}: camera {cam.id}"
        )
        frames.append(
            Frame(
                stem=Path(im.name).stem,
                image_path=ipath,
                image=img,
                mask=mask,
                viewmat=viewmat,
                K=scaled_K(fx, fy, cx, cy, downscale),
                width=img.shape[1],
                height=img.shape[0],
            )
        )

    train_idx, test_idx = holdout_split(str(files["images"]), len(frames), test_every)
    train, test = [frames[i] for i in train_idx], [frames[i] for i in test_idx]

    points = colors = None
    if len(xyz) > 0:
        points = torch.from_numpy(xyz).float()  # [M, 3]
        colors = torch.from_numpy(rgb.astype(np.float32) / 255.0)  # [M, 3]
    return SceneData(train=train, test=test, points=points, point_colors=colors, layout="colmap")


def _check_size(ipath: Path, cam: ColmapCamera, cam_file: Path) -> None:
    W, H = image_size(ipath)
    if (W, H) != (cam.width, cam.height):
        raise DataError(
            f"{ipath}: image is {W}x{H} pixels but its camera {cam.id} in {cam_file} is "
            f"{cam.width}x{cam.height} (size mismatch; resized images need a matching model)"
        )
