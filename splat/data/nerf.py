"""NeRF-synthetic ("Blender") layout -> :class:`SceneData`.

Layout on disk::

    <scene>/transforms_train.json     required
    <scene>/transforms_test.json      optional (missing -> empty test list)
    <scene>/<frames[i].file_path>     relative to the json's folder; the
                                      extension may be left out (then ".png")

Each json holds ``frames[]`` with ``file_path`` and ``transform_matrix``
(camera -> world, 4x4 or 3x4, in the OpenGL convention: x right, y up, the
camera looks along -z).  Intrinsics, top level or per frame (per frame wins):

* ``camera_angle_x`` (horizontal FOV, radians): ``fx = 0.5 W / tan(a/2)``;
  ``fy = fx`` unless ``camera_angle_y`` is given;
  ``cx = W/2``, ``cy = H/2`` (the image centre in the pixel-centre convention);
* or instant-ngp style ``fl_x`` [``fl_y``] [``cx``, ``cy``] [``w``, ``h``];
  ``w``/``h``, when given, must match the image.  Nonzero distortion
  coefficients (``k1 k2 k3 k4 p1 p2``) are refused.

The OpenGL camera -> world matrix becomes an OpenCV world -> camera viewmat by
flipping the camera's y and z axes (``c2w @ diag(1, -1, -1, 1)``) and
inverting.  There are no points: ``SceneData.points`` is ``None``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .types import (DataError, Frame, SceneData, check_intrinsics, check_pose, image_size, load_image,
                    parse_background, scaled_K)

__all__ = ["opengl_c2w_to_viewmat", "load_nerf"]

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


def _get_float(path: Path, where: str, d: dict, key: str) -> Optional[float]:
    if key not in d:
        return None
    try:
        v = float(d[key])
    except (TypeError, ValueError):
        raise DataError(f"{path}: {where}: key {key!r} must be a number, got {d[key]!r}") from None
    if not math.isfinite(v):
        raise DataError(f"{path}: {where}: key {key!r} is not finite")
    return v


def _fmt(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:g}"


def _intrinsics(path: Path, where: str, meta: dict, frame: dict, W: int, H: int):
    """(fx, fy, cx, cy) at the image's full resolution ``W x H``."""

    def get(key: str) -> Optional[float]:
        v = _get_float(path, where, frame, key)
        return v if v is not None else _get_float(path, "top level", meta, key)

    for key in _DISTORTION_KEYS:
        v = get(key)
        if v is not None and v != 0.0:
            raise DataError(
                f"{path}: {where}: nonzero distortion coefficient {key}={v}; only undistorted pinhole cameras "
                "are supported (undistort the images first)"
            )
    w, h = get("w"), get("h")
    if (w is not None and int(round(w)) != W) or (h is not None and int(round(h)) != H):
        raise DataError(
            f"{path}: {where}: the json says the image is {_fmt(w)}x{_fmt(h)} but the image file is {W}x{H} "
            "(size mismatch)"
        )

    fx, fy = get("fl_x"), get("fl_y")
    ax, ay = get("camera_angle_x"), get("camera_angle_y")
    if fx is None and ax is not None:
        if not (0.0 < ax < math.pi):
            raise DataError(f"{path}: {where}: camera_angle_x={ax} is not in (0, pi) radians")
        fx = 0.5 * W / math.tan(0.5 * ax)
    if fy is None and ay is not None:
        if not (0.0 < ay < math.pi):
            raise DataError(f"{path}: {where}: camera_angle_y={ay} is not in (0, pi) radians")
        fy = 0.5 * H / math.tan(0.5 * ay)
    if fx is None and fy is None:
        raise DataError(f"{path}: {where}: missing key 'camera_angle_x' (or 'fl_x'): no focal length")
    fx = fy if fx is None else fx
    fy = fx if fy is None else fy
    if not (fx > 0 and fy > 0):
        raise DataError(f"{path}: {where}: non-positive focal length ({fx}, {fy})")
    cx, cy = get("cx"), get("cy")
    cx = 0.5 * W if cx is None else cx
    cy = 0.5 * H if cy is None else cy
    return fx, fy, cx, cy


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


def _transform(json_path: Path, where: str, frame: dict) -> np.ndarray:
    if "transform_matrix" not in frame:
        raise DataError(f"{json_path}: {where}: missing key 'transform_matrix'")
    try:
        M = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{json_path}: {where}: 'transform_matrix' is not a numeric matrix") from None
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


def _load_split(json_path: Path, downscale: int, bg: torch.Tensor) -> list[Frame]:
    meta = _read_json(json_path)
    frames: list[Frame] = []
    for i, fr in enumerate(meta["frames"]):
        where = f"frames[{i}]"
        if not isinstance(fr, dict):
            raise DataError(f"{json_path}: {where} must be a json object")
        if "file_path" not in fr:
            raise DataError(f"{json_path}: {where}: missing key 'file_path'")
        c2w = _transform(json_path, where, fr)
        ipath = _resolve_image(json_path, where, fr["file_path"])
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


def load_nerf(path: Path, downscale: int = 1, background=(1.0, 1.0, 1.0)) -> SceneData:
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
    train = _load_split(train_json, downscale, bg)
    if not train:
        raise DataError(f"{train_json}: 'frames' is empty: zero usable cameras")
    test_json = root / "transforms_test.json"
    test = _load_split(test_json, downscale, bg) if test_json.is_file() else []
    return SceneData(train=train, test=test, points=None, point_colors=None, layout="nerf")
