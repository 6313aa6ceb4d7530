"""Lens undistortion at load time: distorted cameras -> pinhole cameras, with OpenCV.

Supported camera models (COLMAP's names and parameter orders; a
``transforms.json`` camera is first written as one of these, see
:mod:`splat.data.transforms`):

=================  ======================================  ==========================
model              params                                  OpenCV model
=================  ======================================  ==========================
SIMPLE_PINHOLE     f cx cy                                 (nothing to do)
PINHOLE            fx fy cx cy                             (nothing to do)
SIMPLE_RADIAL      f cx cy k                               D = (k, 0, 0, 0)
RADIAL             f cx cy k1 k2                           D = (k1, k2, 0, 0)
OPENCV             fx fy cx cy k1 k2 p1 p2                 D = (k1, k2, p1, p2)
FULL_OPENCV        fx fy cx cy k1 k2 p1 p2 k3 k4 k5 k6     D = (k1, k2, p1, p2, k3, k4, k5, k6)
OPENCV_FISHEYE     fx fy cx cy k1 k2 k3 k4                 ``cv2.fisheye``, D = (k1..k4)
=================  ======================================  ==========================

These are exactly COLMAP's models (``src/colmap/sensor/models.h``), which are
OpenCV's; a test checks the forward models against ``cv2.projectPoints``.

Pixel convention: COLMAP's and splat's principal point put the centre of the
top-left pixel at (0.5, 0.5); OpenCV puts it at (0, 0).  The conversion
(``c - 0.5``) happens only in this file, at the calls into OpenCV.

Crop policy (COLMAP's ``image_undistorter`` / ``UndistortCamera`` is the
reference, with its defaults ``blank_pixels=0, min_scale=0.2,
max_scale=2.0``): the undistorted camera keeps the focal lengths; the image
size is scaled by ``(scale_x, scale_y)`` and the principal point with it.
The scales are chosen from where the distorted image's border lands once
undistorted: ``blank_pixels = 0`` keeps only valid pixels (the largest
rectangle, in COLMAP's per-axis sense, with no blank pixel),
``blank_pixels = 1`` keeps every source pixel (a blank border appears),
values in between interpolate the inverse scales as COLMAP does; each scale
is then clamped to ``[min_scale, max_scale]``.  Blank pixels (outside the
source image) get alpha 0, so they are composited over the background and
carry ``mask = 0`` like the transparent pixels of an RGBA image.

Remapping: ``cv2.initUndistortRectifyMap`` (``cv2.fisheye`` for the fisheye
model) + ``cv2.remap`` with bilinear interpolation (COLMAP's undistorter also
interpolates bilinearly).  Colour is remapped premultiplied by alpha so
transparent source pixels do not bleed into their neighbours.

Refused cameras (a :class:`DataError` naming the image, from
:func:`load_camera_image`): an image border whose undistortion is not
finite (e.g. OPENCV ``p1 = 2``), no positive crop scale (fisheye
``k1 = -5``), or valid pixels covering less than :data:`MIN_VALID_AREA` of the
source image (OPENCV ``k1 = 1e30``), which would train on a blank frame.

Cache: each undistorted image is written once as a PNG (8-bit for 8-bit
sources, else 16-bit; RGBA when it has any transparent pixel) under
``<cache>/undistorted/<key>.png``, where ``<cache>`` is ``$SPLAT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/splat``, else ``~/.cache/splat``, and ``<key>`` is a
SHA-256 of the source file's bytes, both cameras, and this module's format
version.  The key is the content, not the path and modification time, which
a reproducible tarball, ``cp -p`` or ``touch -r`` keep across an edit;
hashing the file costs far less than decoding and remapping it.  Entries are written atomically; one that cannot be read
back (or has the wrong size) is recomputed with a warning.  Deleting the
folder is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from .types import DataError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DISTORTED_MODELS",
    "PINHOLE_MODELS",
    "LensCamera",
    "opencv_camera",
    "distort_points",
    "undistorted_camera",
    "undistortion_maps",
    "valid_area",
    "MIN_VALID_AREA",
    "undistort_array",
    "undistort_file",
    "default_cache_dir",
]

PINHOLE_MODELS = ("SIMPLE_PINHOLE", "PINHOLE")
DISTORTED_MODELS = ("SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV", "OPENCV_FISHEYE")
#: Smallest accepted area of an undistorted image's valid pixels, as a fraction
#: of the source image's area (:func:`valid_area`).  0.04 is a
#: ``0.2 W x 0.2 H`` rectangle, the smallest image COLMAP's undistorter makes
#: (its default ``min_scale = 0.2``).  Real lenses are far above it: barrel
#: and fisheye distortion enlarge the image (GoPro, fisheye: 110-400%),
#: telephoto pincushion (k1 <= ~0.3) keeps 80-90%; an OPENCV k1 of 100 still
#: keeps 6.5%.  Below it the coefficients are corrupt (k1 = 1e30 keeps 0%)
#: and training would fit the background of a blank frame.
MIN_VALID_AREA = 0.04
#: Bump when the cached files' content or format changes.
_CACHE_VERSION = 2


def _cv2():
    try:
        import cv2
    except ImportError as e:  # it is in install_requires; this is a broken install
        raise ImportError("undistorting images needs OpenCV: pip install opencv-python-headless") from e
    return cv2


@dataclass(frozen=True)
class LensCamera:
    """A camera in COLMAP's parameterisation (see the module table).

    ``width``/``height`` in pixels; ``params`` in COLMAP's order, principal
    point in splat's convention (top-left pixel centre at (0.5, 0.5))."""

    model: str
    width: int
    height: int
    params: tuple

    def fxfycxcy(self) -> tuple[float, float, float, float]:
        p = [float(v) for v in self.params]
        if self.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL"):
            return p[0], p[0], p[1], p[2]
        return p[0], p[1], p[2], p[3]

    @property
    def is_pinhole(self) -> bool:
        return self.model in PINHOLE_MODELS


def opencv_camera(cam: LensCamera) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(K [3, 3] in OpenCV's pixel convention, D [n], fisheye)`` of ``cam``."""
    fx, fy, cx, cy = cam.fxfycxcy()
    K = np.array([[fx, 0.0, cx - 0.5], [0.0, fy, cy - 0.5], [0.0, 0.0, 1.0]])
    p = [float(v) for v in cam.params]
    m = cam.model
    if m in PINHOLE_MODELS:
        D = np.zeros(4)
    elif m == "SIMPLE_RADIAL":
        D = np.array([p[3], 0.0, 0.0, 0.0])
    elif m == "RADIAL":
        D = np.array([p[3], p[4], 0.0, 0.0])
    elif m == "OPENCV":
        D = np.array(p[4:8])
    elif m == "FULL_OPENCV":
        D = np.array(p[4:12])
    elif m == "OPENCV_FISHEYE":
        D = np.array(p[4:8])
    else:
        raise ValueError(f"camera model {m} is not supported (supported: {PINHOLE_MODELS + DISTORTED_MODELS})")
    return K, D, m == "OPENCV_FISHEYE"


def distort_points(cam: LensCamera, xy: np.ndarray) -> np.ndarray:
    """Forward model: normalised undistorted image-plane points ``[N, 2]``
    (x/z, y/z) -> distorted pixels ``[N, 2]`` in splat's convention."""
    cv2 = _cv2()
    K, D, fisheye = opencv_camera(cam)
    pts = np.concatenate([np.asarray(xy, np.float64), np.ones((len(xy), 1))], 1).reshape(-1, 1, 3)
    zero = np.zeros(3)
    if fisheye:
        uv, _ = cv2.fisheye.projectPoints(pts, zero, zero, K, D)
    else:
        uv, _ = cv2.projectPoints(pts, zero, zero, K, D)
    return uv.reshape(-1, 2) + 0.5


def _undistort_to_normalised(cam: LensCamera, uv: np.ndarray) -> np.ndarray:
    """Distorted pixels ``[N, 2]`` (splat convention) -> normalised points ``[N, 2]``."""
    cv2 = _cv2()
    K, D, fisheye = opencv_camera(cam)
    pts = (np.asarray(uv, np.float64) - 0.5).reshape(-1, 1, 2)
    if fisheye:
        out = cv2.fisheye.undistortPoints(pts, K, D)
    else:
        # Iterative inversion; more iterations than the default 5 for strong distortion.
        crit = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-12)
        if hasattr(cv2, "undistortPointsIter"):  # OpenCV 4
            out = cv2.undistortPointsIter(pts, K, D, None, None, crit)
        else:  # OpenCV 5 folded it into undistortPoints
            out = cv2.undistortPoints(pts, K, D, R=None, P=None, criteria=crit)
    return out.reshape(-1, 2)


def undistorted_camera(
    cam: LensCamera, blank_pixels: float = 0.0, min_scale: float = 0.2, max_scale: float = 2.0
) -> LensCamera:
    """The PINHOLE camera ``cam`` is undistorted into (COLMAP's ``UndistortCamera``).

    Focal lengths are kept; the size becomes ``floor(scale * size)`` and the
    principal point ``c * new_size / size``, with the per-axis scales chosen
    from the undistorted image border (see the module docstring)."""
    fx, fy, cx, cy = cam.fxfycxcy()
    W, H = cam.width, cam.height
    if cam.is_pinhole:
        return LensCamera("PINHOLE", W, H, (fx, fy, cx, cy))
    if not 0.0 <= blank_pixels <= 1.0:
        raise ValueError(f"blank_pixels must be in [0, 1], got {blank_pixels}")
    # Undistorted positions (same focal lengths and principal point) of the
    # centres of the border pixels.
    ys = np.arange(H) + 0.5
    xs = np.arange(W) + 0.5
    left = np.stack([np.full(H, 0.5), ys], 1)
    right = np.stack([np.full(H, W - 0.5), ys], 1)
    top = np.stack([xs, np.full(W, 0.5)], 1)
    bottom = np.stack([xs, np.full(W, H - 0.5)], 1)

    def und(p):
        n = _undistort_to_normalised(cam, p)
        return np.stack([fx * n[:, 0] + cx, fy * n[:, 1] + cy], 1)

    L, R, T, B = und(left)[:, 0], und(right)[:, 0], und(top)[:, 1], und(bottom)[:, 1]
    if not all(np.all(np.isfinite(a)) for a in (L, R, T, B)):
        raise ValueError(f"camera {cam}: the undistortion of the image border is not finite")
    # Scale making the new left edge fall on the innermost (valid-only) or
    # outermost (all pixels) undistorted border point, per side; COLMAP's
    # min_scale_* / max_scale_* are the inverses of these.
    with np.errstate(divide="ignore", invalid="ignore"):
        inner_x = min((cx - L.max()) / cx, (R.min() - cx) / (W - cx))
        outer_x = max((cx - L.min()) / cx, (R.max() - cx) / (W - cx))
        inner_y = min((cy - T.max()) / cy, (B.min() - cy) / (H - cy))
        outer_y = max((cy - T.min()) / cy, (B.max() - cy) / (H - cy))
    sx = 1.0 / (blank_pixels / outer_x + (1.0 - blank_pixels) / inner_x)
    sy = 1.0 / (blank_pixels / outer_y + (1.0 - blank_pixels) / inner_y)
    if not (np.isfinite(sx) and np.isfinite(sy) and sx > 0 and sy > 0):
        raise ValueError(f"camera {cam}: undistortion gives no valid image (scales {sx}, {sy})")
    sx = float(np.clip(sx, min_scale, max_scale))
    sy = float(np.clip(sy, min_scale, max_scale))
    W2 = max(1, int(sx * W))
    H2 = max(1, int(sy * H))
    new = LensCamera("PINHOLE", W2, H2, (fx, fy, cx * W2 / W, cy * H2 / H))
    area = valid_area(cam, new)
    if area < MIN_VALID_AREA:
        raise ValueError(
            f"camera {cam}: undistortion leaves valid pixels over {100 * area:.2g}% of the source "
            f"image's area (at least {100 * MIN_VALID_AREA:g}% needed): implausible distortion "
            "coefficients"
        )
    return new


def valid_area(cam: LensCamera, new_cam: LensCamera, samples: int = 128) -> float:
    """Area of the valid pixels of ``new_cam`` (those sampling inside the
    source image of ``cam``), as a fraction of the source image's area.

    Measured with the forward model (exact, unlike the iterative inverse the
    crop is chosen with) on at most ``samples`` x ``samples`` pixel centres."""
    fx, fy, cx, cy = new_cam.fxfycxcy()
    nx, ny = min(new_cam.width, samples), min(new_cam.height, samples)
    xs = (np.arange(nx) + 0.5) * (new_cam.width / nx)
    ys = (np.arange(ny) + 0.5) * (new_cam.height / ny)
    x, y = np.meshgrid((xs - cx) / fx, (ys - cy) / fy)
    with np.errstate(all="ignore"):
        uv = distort_points(cam, np.stack([x.ravel(), y.ravel()], 1))
        inside = (uv[:, 0] >= 0) & (uv[:, 0] <= cam.width) & (uv[:, 1] >= 0) & (uv[:, 1] <= cam.height)
    return float(inside.mean()) * new_cam.width * new_cam.height / (cam.width * cam.height)


def undistortion_maps(cam: LensCamera, new_cam: LensCamera) -> tuple[np.ndarray, np.ndarray]:
    """``(map_x, map_y)`` ``[H', W']`` float32 for ``cv2.remap``: the source
    pixel (OpenCV convention) that each pixel of ``new_cam`` samples."""
    cv2 = _cv2()
    K, D, fisheye = opencv_camera(cam)
    K2, _, _ = opencv_camera(new_cam)
    size = (new_cam.width, new_cam.height)
    if fisheye:
        return cv2.fisheye.initUndistortRectifyMap(K, D, np.eye(3), K2, size, cv2.CV_32FC1)
    return cv2.initUndistortRectifyMap(K, D, np.eye(3), K2, size, cv2.CV_32FC1)


def undistort_array(
    rgb: np.ndarray, alpha: Optional[np.ndarray], maps: tuple[np.ndarray, np.ndarray], src_size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Remap float images: ``rgb [H, W, 3]``, ``alpha [H, W]`` or None ->
    ``(rgb [H', W', 3], alpha [H', W'])``.

    Colour is remapped premultiplied by alpha; pixels whose source position
    lies outside the source image (beyond its outer pixel edges) get alpha 0."""
    cv2 = _cv2()
    map_x, map_y = maps
    W, H = src_size
    a = np.ones(rgb.shape[:2], np.float32) if alpha is None else alpha.astype(np.float32)
    pre = np.concatenate([rgb.astype(np.float32) * a[..., None], a[..., None]], axis=2)
    out = cv2.remap(pre, map_x, map_y, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    inside = (map_x >= -0.5) & (map_x <= W - 0.5) & (map_y >= -0.5) & (map_y <= H - 0.5)
    a2 = np.where(inside, out[..., 3], 0.0).astype(np.float32)
    rgb2 = np.where(a2[..., None] > 1e-6, out[..., :3] / np.maximum(out[..., 3:4], 1e-6), 0.0)
    return np.clip(rgb2, 0.0, 1.0).astype(np.float32), np.clip(a2, 0.0, 1.0)


def default_cache_dir() -> Path:
    """``$SPLAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/splat``, else ``~/.cache/splat``."""
    if os.environ.get("SPLAT_CACHE_DIR"):
        return Path(os.environ["SPLAT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splat"


def _cache_key(src: Path, cam: LensCamera, new_cam: LensCamera, kind: str) -> str:
    content = hashlib.sha256()
    try:
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                content.update(block)
    except OSError as e:
        raise DataError(f"{src}: cannot read image ({e})") from None
    ident = {
        "v": _CACHE_VERSION,
        "content": content.hexdigest(),
        "cam": [cam.model, cam.width, cam.height, [float(v) for v in cam.params]],
        "new": [new_cam.width, new_cam.height, [float(v) for v in new_cam.params]],
        "kind": kind,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _write_png(path: Path, rgb: np.ndarray, alpha: np.ndarray, bits: int) -> None:
    """Atomic PNG write of float ``rgb [H, W, C]`` (+ alpha when any is < 1)."""
    from ..run_folder import atomic_write_bytes

    cv2 = _cv2()
    img = rgb if rgb.ndim == 3 else rgb[..., None]
    if bool((alpha < 1.0).any()):
        img = np.concatenate([img, alpha[..., None]], axis=2)
    scale, dtype = (255.0, np.uint8) if bits == 8 else (65535.0, np.uint16)
    q = np.round(np.clip(img, 0.0, 1.0) * scale).astype(dtype)
    if q.shape[2] == 1:
        q = q[..., 0]
    elif q.shape[2] == 3:
        q = q[..., ::-1]  # RGB -> OpenCV's BGR
    else:
        q = q[..., [2, 1, 0, 3]]
    ok, png = cv2.imencode(".png", np.ascontiguousarray(q))
    if not ok:
        raise OSError("cv2.imencode failed")
    atomic_write_bytes(path, png.tobytes())


def _is_8bit(x: np.ndarray) -> bool:
    return bool(np.all(np.abs(x * 255.0 - np.round(x * 255.0)) < 1e-3))


_MAPS: dict = {}  # (cam, new_cam) -> maps, for the images of one camera within a process


def undistort_file(
    src: Union[str, Path],
    cam: LensCamera,
    new_cam: LensCamera,
    cache_dir: Optional[Union[str, Path]] = None,
    kind: str = "image",
    refresh: bool = False,
) -> Path:
    """The cached undistorted copy of image file ``src`` (computed on a miss,
    or always with ``refresh``).

    ``kind="image"`` keeps colour and alpha; ``kind="mask"`` stores one grey
    channel (the mean of the source's channels, times its alpha).  Returns the
    PNG's path, to be read by the ordinary image loader."""
    import torch

    from .types import load_image

    src = Path(src)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    out = cache / "undistorted" / f"{_cache_key(src, cam, new_cam, kind)}.png"
    if out.is_file() and not refresh:
        return out
    img, mask = load_image(src, 1, torch.zeros(3))  # composited over black = premultiplied
    rgb = img.numpy()
    if rgb.shape[1] != cam.width or rgb.shape[0] != cam.height:
        raise DataError(f"{src}: image is {rgb.shape[1]}x{rgb.shape[0]} but its camera is {cam.width}x{cam.height}")
    alpha = None if mask is None else mask.numpy()
    if alpha is not None:  # un-premultiply; undistort_array premultiplies again
        rgb = np.where(alpha[..., None] > 0, rgb / np.maximum(alpha[..., None], 1e-12), 0.0)
    if kind == "mask":
        rgb = rgb.mean(axis=2, keepdims=True).repeat(3, axis=2) * (1.0 if alpha is None else alpha[..., None])
        alpha = None
    key = (cam, new_cam)
    if key not in _MAPS:
        _MAPS.clear()  # keep one camera's maps (1080p: ~16 MB)
        _MAPS[key] = undistortion_maps(cam, new_cam)
    rgb2, a2 = undistort_array(rgb, alpha, _MAPS[key], (cam.width, cam.height))
    bits = 8 if _is_8bit(img.numpy()) else 16
    try:
        if kind == "mask":
            _write_png(out, rgb2[..., 0] * a2, np.ones_like(a2), bits)
        else:
            _write_png(out, rgb2, a2, bits)
    except OSError as e:
        raise DataError(
            f"{out}: cannot write the undistortion cache ({e}); set SPLAT_CACHE_DIR "
            "or data.cache_dir to a writable folder"
        ) from e
    return out


def load_camera_image(
    path: Path,
    cam: LensCamera,
    downscale: int,
    background: torch.Tensor,
    cache_dir: Optional[Union[str, Path]] = None,
    blank_pixels: float = 0.0,
    kind: str = "image",
    camera_name: str = "",
) -> tuple[torch.Tensor, Optional[torch.Tensor], tuple[float, float, float, float]]:
    """Load one image of camera ``cam`` as a pinhole image.

    ``camera_name`` (e.g. ``"sparse/0/cameras.txt: camera 3"``) names the
    camera in the error when its distortion cannot be undone.

    Returns ``(image [h, w, 3], mask [h, w] or None, (fx, fy, cx, cy) at full
    resolution of the pinhole image)``.  Distorted cameras go through the
    on-disk cache (:func:`undistort_file`); pinhole cameras read ``path``
    directly.  ``downscale`` and ``background`` are applied by
    :func:`splat.data.types.load_image` after undistortion."""
    from .types import load_image

    if cam.is_pinhole:
        img, mask = load_image(path, downscale, background)
        return img, mask, cam.fxfycxcy()
    try:
        new_cam = _new_camera(cam, blank_pixels)
    except ValueError as e:
        where = f" ({camera_name})" if camera_name else ""
        raise DataError(f"{path}: cannot undistort{where}: {e}") from None
    s = int(downscale)
    if new_cam.width < s or new_cam.height < s:  # else load_image would blame the cache file
        raise DataError(
            f"{path}: undistorted image of {new_cam.width}x{new_cam.height} pixels is smaller than downscale factor {s}"
        )
    cached = undistort_file(path, cam, new_cam, cache_dir, kind=kind)
    try:
        img, mask = load_image(cached, downscale, background)
        problem = None if img.shape[:2] == (new_cam.height // s, new_cam.width // s) else "wrong size"
    except DataError as e:  # a truncated or overwritten entry: the cache is disposable
        problem = str(e).removeprefix(f"{cached}: ")
    if problem is not None:
        print(
            f"warning: corrupt undistortion cache entry {cached} ({problem}) for {path}: recomputed it", file=sys.stderr
        )
        cached = undistort_file(path, cam, new_cam, cache_dir, kind=kind, refresh=True)
        img, mask = load_image(cached, downscale, background)
    return img, mask, new_cam.fxfycxcy()


_NEW_CAMS: dict = {}


def _new_camera(cam: LensCamera, blank_pixels: float) -> LensCamera:
    key = (cam, blank_pixels)
    if key not in _NEW_CAMS:
        _NEW_CAMS[key] = undistorted_camera(cam, blank_pixels)
    return _NEW_CAMS[key]
