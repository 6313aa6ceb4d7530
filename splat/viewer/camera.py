"""Viewer camera <-> splat camera: the one place where the conversion lives.

viser reports a browser camera as ``wxyz`` (unit quaternion, w first) and
``position``: the camera-to-world rotation R and the camera centre, so that
``p_world = R p_camera + position``.  Its camera frame is OpenCV's (x right,
y down, z forward, as viser documents for ``CameraHandle.wxyz``), the same as
splat's (``splat/conventions.py``), so no axis flip is needed: splat's
``viewmat`` (world -> camera) is simply the inverse, ``[R^T | -R^T position]``.

viser's ``fov`` is the *vertical* field of view in radians, and the image
fills the canvas with its principal point at the centre.  In splat's pixel
convention (pixel (i, j) centred at (j + 0.5, i + 0.5)) that is
``fx = fy = (H / 2) / tan(fov / 2)``, ``cx = W / 2``, ``cy = H / 2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, Tuple

import numpy as np
import torch


@dataclass
class Camera:
    """What :func:`splat.model_render.render_frame` needs of a view."""

    viewmat: torch.Tensor  # [4, 4] world -> camera, OpenCV
    K: torch.Tensor  # [3, 3]
    width: int
    height: int


def quat_to_matrix(wxyz: Sequence[float] | np.ndarray) -> np.ndarray:
    """Rotation matrix [3, 3] of a (w, x, y, z) quaternion (normalised here)."""
    w, x, y, z = np.asarray(wxyz, dtype=np.float64) / np.linalg.norm(wxyz)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """(w, x, y, z) of a rotation matrix [3, 3] (Shepperd's method, w >= 0)."""
    R = np.asarray(R, dtype=np.float64)
    tr = np.trace(R)
    if tr > 0:
        s = 2.0 * math.sqrt(1.0 + tr)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(R)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + R[i, i] - R[j, j] - R[k, k], 1e-300))
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (R[k, j] - R[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (R[j, i] + R[i, j]) / s
        q[1 + k] = (R[k, i] + R[i, k]) / s
    q = np.array(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def viewmat_from_pose(wxyz: Sequence[float] | np.ndarray, position: Sequence[float] | np.ndarray) -> np.ndarray:
    """splat's world -> camera ``viewmat`` [4, 4] of a viser pose."""
    R = quat_to_matrix(wxyz)  # camera -> world
    V = np.eye(4)
    V[:3, :3] = R.T
    V[:3, 3] = -R.T @ np.asarray(position, dtype=np.float64)
    return V


def pose_from_viewmat(viewmat: np.ndarray | torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """(wxyz, position) of a world -> camera ``viewmat`` [4, 4]."""
    V = np.asarray(viewmat, dtype=np.float64)
    R = V[:3, :3].T  # camera -> world
    return matrix_to_quat(R), -R @ V[:3, 3]


def intrinsics(fov_y: float, width: int, height: int) -> np.ndarray:
    """K [3, 3] of a centred pinhole camera with vertical field of view ``fov_y`` (radians)."""
    f = 0.5 * height / math.tan(0.5 * fov_y)
    return np.array([[f, 0.0, 0.5 * width], [0.0, f, 0.5 * height], [0.0, 0.0, 1.0]])


def fov_y_of(K: np.ndarray | torch.Tensor, height: int) -> float:
    """Vertical field of view (radians) of intrinsics ``K`` for an image ``height`` pixels tall."""
    return 2.0 * math.atan(0.5 * height / float(np.asarray(K)[1, 1]))


def render_size(width: int, height: int, scale: float) -> Tuple[int, int]:
    """Pixel size of a render at ``scale`` times the canvas size (at least 1 x 1)."""
    return max(1, int(round(width * scale))), max(1, int(round(height * scale)))


def camera_from_view(
    wxyz: Sequence[float] | np.ndarray,
    position: Sequence[float] | np.ndarray,
    fov_y: float,
    width: int,
    height: int,
    scale: float = 1.0,
) -> Camera:
    """The splat camera of a browser view (canvas ``width`` x ``height``) rendered at ``scale``.

    The render covers the same field of view at fewer pixels; the browser
    stretches it over the canvas."""
    w, h = render_size(width, height, scale)
    return Camera(
        viewmat=torch.tensor(viewmat_from_pose(wxyz, position), dtype=torch.float32),
        K=torch.tensor(intrinsics(fov_y, w, h), dtype=torch.float32),
        width=w,
        height=h,
    )


@dataclass
class StartView:
    """Where the browser camera starts: viser's initial camera settings."""

    position: np.ndarray  # [3] camera centre
    look_at: np.ndarray  # [3] orbit centre, on the optical axis
    up: np.ndarray  # [3] world direction of the camera's up (-y)
    fov_y: float  # radians


def start_view_from_camera(
    viewmat: np.ndarray, K: np.ndarray, height: int, target: Sequence[float] | np.ndarray
) -> StartView:
    """Start at a data-set camera: its pose and vertical field of view; the orbit
    centre is the point of its optical axis nearest to ``target`` (e.g. the
    model's centre), at least 1e-3 in front of the camera."""
    _, pos = pose_from_viewmat(viewmat)
    R = np.asarray(viewmat, dtype=np.float64)[:3, :3].T  # camera -> world
    forward, up = R[:, 2], -R[:, 1]
    dist = max(float((np.asarray(target, dtype=np.float64) - pos) @ forward), 1e-3)
    return StartView(pos, pos + dist * forward, up, fov_y_of(K, height))


def start_view_looking_at(
    center: Sequence[float] | np.ndarray, radius: float, fov_y: float = math.radians(50.0)
) -> StartView:
    """A camera outside a sphere (``center``, ``radius``) that frames all of it,
    looking along +z with -y up (the OpenCV/COLMAP habit for captures)."""
    center = np.asarray(center, dtype=np.float64)
    dist = max(float(radius), 1e-6) / math.sin(0.5 * fov_y) * 1.1
    pos = center - np.array([0.0, 0.0, dist])
    return StartView(pos, center.copy(), np.array([0.0, -1.0, 0.0]), fov_y)


# --------------------------------------------------- the page's camera buttons
# ``cam`` is a viser camera handle (CameraHandle): position, look_at, up_direction, wxyz, fov.


def fly(cam: Any, direction: str, step: float) -> None:
    """Move the camera (and its orbit centre) ``step`` along its own axes:
    ``direction`` one of Forward, Back, Left, Right, Up, Down."""
    R = quat_to_matrix(cam.wxyz)  # camera -> world: columns right, down, forward
    axis = {
        "Forward": R[:, 2],
        "Back": -R[:, 2],
        "Right": R[:, 0],
        "Left": -R[:, 0],
        "Down": R[:, 1],
        "Up": -R[:, 1],
    }[direction]
    cam.position = cam.position + step * axis


def turn(cam: Any, direction: str) -> None:
    """Rotate the view 10 degrees about the camera centre: ``direction`` one of
    Yaw L, Yaw R (about the up direction), Pitch U, Pitch D."""
    R = quat_to_matrix(cam.wxyz)
    angle = math.radians(10.0) * (1 if direction in ("Yaw R", "Pitch U") else -1)
    axis = cam.up_direction if direction.startswith("Yaw") else R[:, 0]
    axis = np.asarray(axis, dtype=np.float64) / max(np.linalg.norm(axis), 1e-12)
    if direction.startswith("Yaw"):
        axis = -axis  # a positive yaw turns to the right: about -up in OpenCV's frame
    offset = cam.look_at - cam.position
    c, s = math.cos(angle), math.sin(angle)
    rotated = offset * c + np.cross(axis, offset) * s + axis * (axis @ offset) * (1 - c)
    cam.look_at = cam.position + rotated


def reset_view(cam: Any, start: StartView) -> None:
    """Put the camera back where browsers start."""
    cam.up_direction = tuple(start.up)
    cam.position = tuple(start.position)
    cam.look_at = tuple(start.look_at)
    cam.fov = float(start.fov_y)
