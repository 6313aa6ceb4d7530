"""NeRF-synthetic ("Blender") layout -> :class:`SceneData`.

Layout on disk::

    <scene>/transforms_train.json     required
    <scene>/transforms_test.json      optional (missing -> empty test list)
    <scene>/<frames[i].file_path>     relative to the json's folder; the
                                      extension may be left out (then ".png")

Each json holds ``frames[]`` with ``file_path`` and ``transform_matrix``
(camera -> world, 4x4 or 3x4, in the OpenGL convention: x right, y up, the
camera looks along -z).  Intrinsics, top level or per frame (per frame wins,
group by group: see :data:`CAMERA_KEY_GROUPS`):

* ``camera_angle_x`` (horizontal FOV, radians): ``fx = 0.5 W / tan(a/2)``;
  ``fy = fx`` unless ``camera_angle_y`` is given;
  ``cx = W/2``, ``cy = H/2`` (the image centre in the pixel-centre convention);
* or instant-ngp style ``fl_x`` [``fl_y``] [``cx``, ``cy``] [``w``, ``h``];
  ``w``/``h``, when given, must match the image.  Nonzero distortion
  coefficients (``k1 k2 k3 k4 p1 p2``) are refused.

Every numeric key must be a json number: ``true``/``false`` (which Python
would take as 1/0) and strings are refused, as is ``transform_matrix`` with
anything but numbers in it.  An image named twice (by two frames, or by both
json files) is refused: it would be trained on twice, or tested on after
being trained on.

The OpenGL camera -> world matrix becomes an OpenCV world -> camera viewmat by
flipping the camera's y and z axes (``c2w @ diag(1, -1, -1, 1)``) and
inverting.  There are no points: ``SceneData.points`` is ``None``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .types import (
    BackgroundLike,
    DataError,
    Frame,
    SceneData,
    check_intrinsics,
    check_pose,
    image_size,
    load_image,
    parse_background,
    scaled_K,
)

__all__ = ["CAMERA_KEY_GROUPS", "CameraKeys", "opengl_c2w_to_viewmat", "load_nerf", "pinhole_intrinsics"]

_GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])
_DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")


def opengl_c2w_to_viewmat(c2w: np.ndarray) -> np.ndarray:
    """OpenGL camera -> world ``[4, 4]`` -> OpenCV world -> camera ``[4, 4]`` (float64).

    Flipping the camera's y and z axes (right-multiplying by
    ``diag(1, -1, -1, 1)``) turns the OpenGL camera frame into OpenCV's; the
    rigid inverse then gives world -> camera.
    """
    c2w_cv = np.asarray(c2w, dtype=np.float64) @ _GL_TO_CV
    R = c2w_cv[:3, :3]
    t = c2w_cv[:3, 3]
    V = np.eye(4)
    V[:3, :3] = R.T
    V[:3, 3] = -R.T @ t
    return V


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise DataError(f"{path}: missing json file")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: cannot parse json ({e})") from e
    if not isinstance(meta, dict):
        raise DataError(f"{path}: top level must be a json object")
    if "frames" not in meta:
        raise DataError(f"{path}: missing key 'frames'")
    if not isinstance(meta["frames"], list):
        raise DataError(f"{path}: 'frames' must be a list")
    return meta


def _is_number(v: Any) -> bool:
    """A json number; not a bool, which ``float()`` would quietly take as 1 or 0."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _get_float(path: Path, where: str, d: dict, key: str) -> Optional[float]:
    """``d[key]`` as a finite float, None when absent; every numeric key is read here."""
    if key not in d:
        return None
    if not _is_number(d[key]):
        raise DataError(f"{path}: {where}: key {key!r} must be a number, got {json.dumps(d[key])}")
    try:
        v = float(d[key])
    except OverflowError:  # a json integer with hundreds of digits
        v = math.inf
    if not math.isfinite(v):
        raise DataError(f"{path}: {where}: key {key!r} is not finite")
    return v


def _fmt(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:g}"


#: Camera keys of a transforms json, in the groups that are read together.
#: A group comes wholly from the frame when the frame holds any of its keys,
#: else wholly from the top level: a frame's own ``camera_angle_x`` must not
#: lose to a top-level ``fl_x``, nor be paired with a top-level ``fl_y``
#: (nerfstudio writes both at the top level); a frame's ``cx`` goes with its
#: own ``cy``, its ``k1`` with its own ``k2``...  ``camera_model`` stands
#: alone: Metashape exports write it at the top level and the coefficients
#: per frame.
CAMERA_KEY_GROUPS = (
    ("w",),
    ("h",),
    ("camera_model",),
    ("fl_x", "fl_y", "camera_angle_x", "camera_angle_y"),
    ("cx", "cy"),
    ("k1", "k2", "k3", "k4", "p1", "p2"),
)


class CameraKeys:
    """One frame's camera keys, each looked up where :data:`CAMERA_KEY_GROUPS` says."""

    def __init__(self, json_path: Path, where: str, meta: dict, frame: dict):
        self.json_path, self.where = json_path, where
        self._src = {}
        for group in CAMERA_KEY_GROUPS:
            src = (frame, where) if any(k in frame for k in group) else (meta, "top level")
            self._src.update((k, src) for k in group)

    def raw(self, key: str) -> Any:
        return self._src[key][0].get(key)

    def number(self, key: str) -> Optional[float]:
        d, where = self._src[key]
        return _get_float(self.json_path, where, d, key)


def pinhole_intrinsics(keys: CameraKeys, W: int, H: int) -> tuple[float, float, float, float]:
    """(fx, fy, cx, cy) at the image's full resolution ``W x H``: ``fl_x``
    (else ``camera_angle_x``) and ``fl_y`` (else ``camera_angle_y``), the
    missing one copied from the other; ``cx, cy`` default to the centre."""
    path, where = keys.json_path, keys.where
    w, h = keys.number("w"), keys.number("h")
    if (w is not None and int(round(w)) != W) or (h is not None and int(round(h)) != H):
        raise DataError(
            f"{path}: {where}: the json says the image is {_fmt(w)}x{_fmt(h)} but the image file is {W}x{H} "
            "(size mismatch; resized images need matching intrinsics)"
        )
    focal = []
    for fl, angle, n in (("fl_x", "camera_angle_x", W), ("fl_y", "camera_angle_y", H)):
        f, a = keys.number(fl), keys.number(angle)
        if f is None and a is not None:
            if not 0.0 < a < math.pi:
                raise DataError(f"{path}: {where}: {angle}={a} is not in (0, pi) radians")
            f = 0.5 * n / math.tan(0.5 * a)
        focal.append(f)
    fx, fy = focal
    if fx is None and fy is None:
        raise DataError(f"{path}: {where}: missing key 'fl_x' or 'camera_angle_x': no focal length")
    fx = fy if fx is None else fx
    fy = fx if fy is None else fy
    if not (fx > 0 and fy > 0):
        raise DataError(f"{path}: {where}: non-positive focal length ({fx}, {fy})")
    cx, cy = keys.number("cx"), keys.number("cy")
    return fx, fy, 0.5 * W if cx is None else cx, 0.5 * H if cy is None else cy


def _intrinsics(path: Path, where: str, meta: dict, frame: dict, W: int, H: int):
    """(fx, fy, cx, cy) at the image's full resolution ``W x H``; distortion refused."""
    keys = CameraKeys(path, where, meta, frame)
    for key in _DISTORTION_KEYS:
        v = keys.number(key)
        if v is not None and v != 0.0:
            raise DataError(
                f"{path}: {where}: nonzero distortion coefficient {key}={v}; only undistorted pinhole cameras "
                "are supported (undistort the images first)"
            )
    return pinhole_intrinsics(keys, W, H)


def _resolve_image(json_path: Path, where: str, file_path: Any) -> Path:
    if not isinstance(file_path, str) or not file_path:
        raise DataError(f"{json_path}: {where}: 'file_path' must be a non-empty string, got {file_path!r}")
    p = json_path.parent / file_path
    if p.is_file():
        return p
    q = p.with_name(p.name + ".png")
    if q.is_file():
        return q
    raise DataError(f"{p}: image file not found (tried {p.name} and {q.name}; named by {json_path}, {where})")


def resolve_unique_image(json_path: Path, where: str, file_path: Any, seen: dict) -> Path:
    """:func:`_resolve_image`, refusing an image that an earlier frame of
    ``seen`` (normalised path -> that frame's ``where``, updated here) uses:
    a duplicated frame would be trained on twice, or land in both the train
    and the test split, and two copies may disagree on the pose."""
    p = _resolve_image(json_path, where, file_path)
    key = os.path.normcase(os.path.abspath(p))
    if key in seen:
        raise DataError(
            f"{json_path}: {where} and {seen[key]} both use image {file_path!r} (a duplicated frame: "
            "it would be trained on twice or be both a train and a test view); remove one"
        )
    seen[key] = where
    return p


def _transform(json_path: Path, where: str, frame: dict) -> np.ndarray:
    if "transform_matrix" not in frame:
        raise DataError(f"{json_path}: {where}: missing key 'transform_matrix'")
    rows = frame["transform_matrix"]
    try:
        if not (isinstance(rows, list) and all(isinstance(r, list) and all(map(_is_number, r)) for r in rows)):
            raise TypeError
        M = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise DataError(
            f"{json_path}: {where}: 'transform_matrix' is not a numeric matrix (a list of rows of json numbers)"
        ) from None
    if M.shape == (3, 4):
        M = np.vstack([M, [0.0, 0.0, 0.0, 1.0]])
    if M.shape != (4, 4):
        raise DataError(f"{json_path}: {where}: 'transform_matrix' must be 4x4 (or 3x4), got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        raise DataError(f"{json_path}: {where}: 'transform_matrix' has non-finite entries")
    R = M[:3, :3]
    if not np.allclose(M[3], [0, 0, 0, 1], atol=1e-6) or not np.allclose(R.T @ R, np.eye(3), atol=1e-3):
        raise DataError(
            f"{json_path}: {where}: 'transform_matrix' is not a rigid camera-to-world transform "
            "(rotation not orthonormal, or last row not 0 0 0 1)"
        )
    if np.linalg.det(R) < 0:
        raise DataError(
            f"{json_path}: {where}: 'transform_matrix' is a reflection (rotation part has determinant -1), "
            "not a rigid camera-to-world transform"
        )
    return M


def _load_split(json_path: Path, downscale: int, bg: torch.Tensor, seen: dict) -> list[Frame]:
    """The frames of one json; ``seen``: see :func:`resolve_unique_image`."""
    meta = _read_json(json_path)
    frames: list[Frame] = []
    for i, fr in enumerate(meta["frames"]):
        where = f"frames[{i}]"
        if not isinstance(fr, dict):
            raise DataError(f"{json_path}: {where} must be a json object")
        if "file_path" not in fr:
            raise DataError(f"{json_path}: {where}: missing key 'file_path'")
        c2w = _transform(json_path, where, fr)
        ipath = resolve_unique_image(json_path, where, fr["file_path"], seen)
        # Intrinsics are defined at full resolution: read the size from the header first.
        W, H = image_size(ipath)
        fx, fy, cx, cy = _intrinsics(json_path, where, meta, fr, W, H)
        check_intrinsics(f"{json_path}: {where}", fx, fy, cx, cy)
        img, mask = load_image(ipath, downscale, bg)
        frames.append(
            Frame(
                stem=ipath.stem,
                image_path=ipath,
                image=img,
                mask=mask,
                viewmat=check_pose(f"{json_path}: {where}", opengl_c2w_to_viewmat(c2w)),
                K=scaled_K(fx, fy, cx, cy, downscale),
                width=img.shape[1],
                height=img.shape[0],
            )
        )
    return frames


def load_nerf(path: Path, downscale: int = 1, background: BackgroundLike = (1.0, 1.0, 1.0)) -> SceneData:
    """Load a NeRF-synthetic scene folder (see the module docstring).

    Args:
        path: the folder holding ``transforms_train.json``.
        downscale: integer factor; images are area-averaged and K divided.
        background: RGB in [0, 1] that RGBA images are composited over.

    Raises:
        DataError: for a missing/invalid json, missing keys, missing or
            unreadable images, or zero training frames.
    """
    root = Path(path)
    bg = parse_background(background)
    train_json = root / "transforms_train.json"
    seen: dict = {}  # one for both files: a test image that is also a training image is refused
    train = _load_split(train_json, downscale, bg, seen)
    if not train:
        raise DataError(f"{train_json}: 'frames' is empty: zero usable cameras")
    test_json = root / "transforms_test.json"
    seen = {k: f"{train_json.name} {w}" for k, w in seen.items()}
    test = _load_split(test_json, downscale, bg, seen) if test_json.is_file() else []
    return SceneData(train=train, test=test, points=None, point_colors=None, layout="nerf")
