"""The types every loader returns, and the image loading they share.

Everything here is already in splat's one camera convention (see
``splat/conventions.py``): ``viewmat`` is world -> camera in the OpenCV
convention (x right, y down, z forward), ``K`` is in pixels, and the pixel at
row ``i``, column ``j`` has its centre at ``(j + 0.5, i + 0.5)``.  Nothing past
the loaders knows any other convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import SplatInputError

__all__ = [
    "DataError",
    "Frame",
    "SceneData",
    "area_downscale",
    "check_intrinsics",
    "check_points",
    "check_pose",
    "first_repeat",
    "holdout_split",
    "image_size",
    "load_image",
    "parse_background",
    "read_image",
    "read_mask",
]


class DataError(SplatInputError):
    """Any problem with the data on disk (a :class:`splat.errors.SplatInputError`,
    so the CLIs print it as one line ``error: ...``).

    The message always names the offending file (or folder) and says what is
    wrong with it, e.g. ``"/data/x/sparse/0/images.bin: truncated: ..."``.
    Loaders never let a bare ``KeyError``/``struct.error``/``OSError`` escape
    for bad data.
    """


@dataclass
class Frame:
    """One posed image.

    Attributes:
        stem: image file name without extension, e.g. ``"train_003"``.
        image_path: the file the image was read from.
        image: ``[H, W, 3]`` float32 in [0, 1]; an RGBA image is composited
            over the scene's background colour (``rgb * a + bg * (1 - a)``).
        mask: ``[H, W]`` float32 alpha in [0, 1], or ``None`` when the image
            has no alpha channel.
        viewmat: ``[4, 4]`` float32 world -> camera, OpenCV convention.
        K: ``[3, 3]`` float32 intrinsics in pixels, already scaled for the
            loader's downscale factor.
        width, height: image size in pixels (after downscaling); equal to
            ``image.shape[1]``, ``image.shape[0]``.
        loss_mask: ``[H, W]`` float32 in [0, 1] weighting each pixel in the
            photometric loss (``data.masks=ignore``: 0 = left out), or
            ``None`` (every pixel counts).
        object_mask: ``[H, W]`` float32 weights in [0, 1] of the frame's
            mask file (``transforms.json`` ``mask_path``, 1 = object) as
            read, whatever ``data.masks`` did with it, or ``None``.  Read for
            every frame when ``data.masks`` is not ``none``, else for the test
            frames only when asked (``eval_masks``, for ``eval.masked``).
    """

    stem: str
    image_path: Path
    image: torch.Tensor  # [H, W, 3]
    mask: Optional[torch.Tensor]  # [H, W] or None
    viewmat: torch.Tensor  # [4, 4]
    K: torch.Tensor  # [3, 3]
    width: int
    height: int
    loss_mask: Optional[torch.Tensor] = None  # [H, W] or None
    object_mask: Optional[torch.Tensor] = None  # [H, W] or None

    @property
    def camera_center(self) -> torch.Tensor:
        """Camera centre in world coordinates, ``-R^T t``.  # [3]"""
        R = self.viewmat[:3, :3]  # [3, 3]
        t = self.viewmat[:3, 3]  # [3]
        return -(R.T @ t)

    def __repr__(self) -> str:  # keep the tensors out of the repr
        return (
            f"Frame(stem={self.stem!r}, {self.width}x{self.height}, "
            f"mask={'yes' if self.mask is not None else 'no'}, "
            f"image_path={str(self.image_path)!r})"
        )


@dataclass
class SceneData:
    """A loaded scene: train/test frames and optional initial points.

    Attributes:
        train, test: lists of :class:`Frame`.  ``test`` may be empty.
        points: ``[M, 3]`` float32 initial points (COLMAP points3D) or
            ``None`` (NeRF-synthetic, or a COLMAP model with no points): the
            trainer then initialises randomly.
        point_colors: ``[M, 3]`` float32 colours in [0, 1], or ``None``
            exactly when ``points`` is ``None``.
        layout: ``"colmap"``, ``"nerf"`` or ``"transforms"``, the layout it was read from.
    """

    train: list
    test: list
    points: Optional[torch.Tensor]  # [M, 3]
    point_colors: Optional[torch.Tensor]  # [M, 3]
    layout: str

    def scene_radius(self) -> float:
        """3DGS's ``cameras_extent``: 1.1 x the largest distance of a training
        camera centre from the mean training camera centre.

        Falls back to all frames when there are no training frames, and
        returns 1.0 when every camera sits at the same point (radius 0), so
        that callers can always divide by it.
        """
        frames = self.train if self.train else self.test
        if not frames:
            return 1.0
        centers = torch.stack([f.camera_center for f in frames]).double()  # [N, 3]
        mean = centers.mean(dim=0)  # [3]
        radius = float((centers - mean).norm(dim=1).max()) * 1.1
        return radius if radius > 0.0 else 1.0

    def __repr__(self) -> str:
        npts = 0 if self.points is None else self.points.shape[0]
        return f"SceneData(layout={self.layout!r}, train={len(self.train)}, test={len(self.test)}, points={npts})"


BackgroundLike = Union[Sequence[float], torch.Tensor, np.ndarray]


def parse_background(background: BackgroundLike) -> torch.Tensor:
    """Validate a background colour; returns ``[3]`` float32 in [0, 1]."""
    bg = torch.as_tensor(np.asarray(background, dtype=np.float32)).reshape(-1)
    if bg.numel() != 3:
        raise ValueError(f"background must have 3 components (RGB), got {tuple(bg.tolist())}")
    return bg


#: Largest image accepted, in pixels: Pillow's own decompression-bomb limit
#: (about 9459 x 9459).  A bigger file is refused before it is decoded.
MAX_IMAGE_PIXELS = 89_478_485

# Pillow modes holding 16-bit greyscale samples (16-bit PNGs open as "I;16").
_GREY16_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


def image_size(path: Path) -> tuple[int, int]:
    """(W, H) from the image header, without decoding the pixels.

    Raises :class:`DataError` naming ``path`` if the file is missing, is not
    an image, or has more than :data:`MAX_IMAGE_PIXELS` pixels (a
    decompression bomb, or an image far too large to train on).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: image file not found")
    with _open_image(path) as im:
        return im.size


def _open_image(path: Path):
    """PIL image opened lazily (header only), with the size limit applied."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # we refuse those ourselves
            im = Image.open(path)
    except Image.DecompressionBombError as e:
        raise DataError(f"{path}: image too large ({e}); refusing to decode it") from e
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as e:
        raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from e
    W, H = im.size
    if W * H > MAX_IMAGE_PIXELS:
        im.close()
        raise DataError(
            f"{path}: image of {W}x{H} = {W * H} pixels is larger than the limit of {MAX_IMAGE_PIXELS} pixels "
            "(a decompression bomb, or an image too large to train on: downscale it on disk first)"
        )
    return im


def read_image(path: Path) -> np.ndarray:
    """Decode an image file into ``[H, W, 3]`` RGB or ``[H, W, 4]`` RGBA
    float32 in [0, 1], at its full bit depth.

    The one image reader of every loader.  8-bit images (any Pillow mode:
    L, LA, P, RGB, RGBA, CMYK, 1, ...) are read by Pillow and divided by 255;
    greyscale becomes RGB; a palette or transparency key becomes alpha.
    16-bit greyscale (modes ``I;16``, ``I;16B``, ...) is divided by 65535;
    mode ``I`` (32-bit integers, as older Pillow opens 16-bit PNGs) must hold
    0..65535 and is divided by 65535; mode ``F`` (float TIFF) must already lie
    in [0, 1].  16-bit RGB, RGBA and grey+alpha, which Pillow would cut to 8
    bits, are read by OpenCV (``cv2.imread(..., IMREAD_UNCHANGED)``) and
    divided by 65535.

    Pixels are returned in their stored order: an EXIF orientation tag (a
    phone's portrait photo) is **not** applied.  COLMAP reads images the same
    way, so that every photo of one camera shares its intrinsics; poses and
    intrinsics from COLMAP (and ``convert.py``) refer to the stored pixels.

    Raises :class:`DataError` naming ``path`` for a missing, unreadable,
    truncated, too large or out-of-range image.
    """
    samples, full = _decode(Path(path))
    return samples / np.float32(full)


def _decode(path: Path) -> tuple[np.ndarray, float]:
    """``(samples [H, W, 3|4] float32, full scale)``: the stored sample values
    (0..255 for 8-bit files, 0..65535 for 16-bit ones, [0, 1] for float
    images; exact in float32) and the value that means 1.0.  Kept apart so
    that :func:`read_mask` can tell a 0/1 mask from a 0/255 one."""
    if not path.is_file():
        raise DataError(f"{path}: image file not found")
    with _open_image(path) as im:
        try:
            if im.mode in ("RGB", "RGBA", "LA") and _has_16bit_samples(im):
                return _read_16bit_color(path), 65535.0
            im.load()  # decode now: a truncated file raises here, not later
            if im.mode in _GREY16_MODES or im.mode in ("I", "F"):
                return _grey_to_rgb(path, im)
            has_alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
            arr = np.asarray(im.convert("RGBA" if has_alpha else "RGB"), dtype=np.uint8)  # [H, W, 3|4]
        except (OSError, ValueError, SyntaxError) as e:
            raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from e
    return arr.astype(np.float32), 255.0


def _has_16bit_samples(im) -> bool:
    """True when the file stores 16 bits per channel (Pillow's raw mode, e.g.
    "RGB;16B" for a 16-bit RGB PNG, although it decodes to 8-bit "RGB")."""
    return any(";16" in str(getattr(tile, "args", "")) for tile in getattr(im, "tile", None) or ())


def _read_16bit_color(path: Path) -> np.ndarray:
    import cv2

    arr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)  # uint16 [H, W, 3|4], BGR(A)
    if arr is None or arr.dtype != np.uint16 or arr.ndim != 3 or arr.shape[2] not in (3, 4):
        got = None if arr is None else (arr.dtype, arr.shape)
        raise DataError(f"{path}: cannot read 16-bit colour image (OpenCV returned {got})")
    arr = cv2.cvtColor(arr, cv2.COLOR_BGRA2RGBA if arr.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    return arr.astype(np.float32)


def _grey_to_rgb(path: Path, im) -> tuple[np.ndarray, float]:
    """16-bit, 32-bit integer or float greyscale -> ``(samples [H, W, 3|4], full scale)``."""
    raw = np.asarray(im)
    if im.mode == "F":
        full = 1.0
        if not np.all(np.isfinite(raw)) or raw.min(initial=0.0) < 0 or raw.max(initial=0.0) > 1:
            raise DataError(
                f"{path}: float (mode F) image has values outside [0, 1] or non-finite values; "
                "only [0, 1] float images are supported"
            )
    else:
        full = 65535.0
        if im.mode == "I" and (raw.min(initial=0) < 0 or raw.max(initial=0) > 65535):
            raise DataError(
                f"{path}: 32-bit integer image with values outside 0..65535; only 8- and 16-bit "
                "integer images are supported"
            )
    grey = raw.astype(np.float32)
    rgb = np.repeat(grey[..., None], 3, axis=-1)  # [H, W, 3]
    key = im.info.get("transparency")
    if isinstance(key, int) and im.mode != "F":
        alpha = (raw != key).astype(np.float32)[..., None] * np.float32(full)
        return np.concatenate([rgb, alpha], axis=-1), full
    return rgb, full


#: A mask whose largest value is at most this masks out the whole image.
MASK_EMPTY_BELOW = 1.0 / 255.0
#: An integer mask below white that holds 0 and at most this many other
#: values is a label map (:func:`read_mask`): few values are labels, a soft
#: matte's anti-aliased edges hold many grey levels.
MASK_MAX_LABELS = 15


def read_mask(path: Path) -> np.ndarray:
    """Decode a mask file into ``[H, W]`` float32 weights in [0, 1] (1 = keep).

    The one place masks are interpreted; the rule, first match wins:

    1. an alpha channel (RGBA, LA, PA, or a transparency key) that is not the
       same everywhere is the mask, whatever the colour channels hold (a
       background remover's cut-out, an object in alpha over black RGB);
    2. a palette (``P``) image is a label map: index 0 is background (0),
       every other index is foreground (1), whatever its colour (DAVIS /
       VOC-style masks, index 1 drawn red);
    3. otherwise the largest of the colour channels (grey for a greyscale
       mask; any colour on black counts as kept) scaled by the bit depth's
       full value: 255 (8-bit), 65535 (16-bit), 1 (float).

    In cases 1 and 3 an integer (8- or 16-bit) mask that never reaches the
    full value is a label map when it holds only 0 and 1, or 0 and at most
    :data:`MASK_MAX_LABELS` other values (0/2, object ids 1..n; a
    segmentation output): 0 -> 0, every nonzero label -> 1, not 2/255.
    Any other mask (one that reaches white, or with more grey levels: a soft
    matte) is alpha, its value over the full value.  A mask that nowhere exceeds :data:`MASK_EMPTY_BELOW` (1/255)
    would mask out the whole image: :class:`DataError` naming ``path``.
    """
    path = Path(path)
    samples, full = _decode(path)  # [H, W, 3|4]
    alpha = samples[..., 3] if samples.shape[2] == 4 else None
    if alpha is not None and alpha.min() != alpha.max():
        m = alpha
    elif (index := _palette_indices(path)) is not None:
        m, full = (index != 0).astype(np.float32), 1.0
    else:
        m = samples[..., :3].max(axis=2)
    if full > 1.0 and _is_label_map(m, full):
        m, full = (m != 0).astype(np.float32), 1.0
    m = (m / np.float32(full)).astype(np.float32)
    if not m.max() > MASK_EMPTY_BELOW:
        raise DataError(
            f"{path}: mask is empty (no pixel above 1/255: it would mask out the whole image); "
            "masks are white (or any nonzero label) where the image is kept"
        )
    return m


def _is_label_map(m: np.ndarray, full: float) -> bool:
    """Whether integer mask samples ``m`` (stored values, ``full`` = white)
    hold labels rather than weights (:func:`read_mask`'s rule): below white
    everywhere and either only 0/1, or 0 and a few other values."""
    top = float(m.max())
    if top >= full:
        return False  # reaches white: a 0/255 mask or a soft matte, read as alpha either way
    if top == 1.0:
        return True  # 0/1 (or all 1)
    counts = np.bincount(m.astype(np.int64).ravel(), minlength=int(top) + 1)  # stored values are integers
    return bool(counts[0] > 0) and int(np.count_nonzero(counts[1:])) <= MASK_MAX_LABELS


def _palette_indices(path: Path) -> Optional[np.ndarray]:
    """``[H, W]`` palette indices of a ``P``/``PA`` image, else None."""
    with _open_image(path) as im:
        if im.mode not in ("P", "PA"):
            return None
        try:
            im.load()
            idx = np.asarray(im)
        except (OSError, ValueError, SyntaxError) as e:
            raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from e
    return idx if idx.ndim == 2 else idx[..., 0]


def area_downscale(x: torch.Tensor, s: int) -> torch.Tensor:
    """``[H, W, C]`` -> ``[H // s, W // s, C]``, the mean of each ``s x s``
    block (a size that is not a multiple of ``s`` loses its right/bottom
    edge, so ``K / s`` stays exact)."""
    if s == 1:
        return x
    return F.avg_pool2d(x.permute(2, 0, 1)[None], kernel_size=s, stride=s)[0].permute(1, 2, 0)


def load_image(path: Path, downscale: int, background: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Read an image file into ``(image [h, w, 3], mask [h, w] or None)``.

    * Any 8- or 16-bit image is read at its full bit depth by
      :func:`read_image`.
    * RGBA (and LA, or palette/grey images with a transparency key) is
      composited over ``background`` (``[3]``): ``rgb * a + bg * (1 - a)``,
      and ``a`` is returned as the mask.  Anything else is converted to RGB
      and the mask is ``None``.
    * ``downscale = s > 1`` averages each ``s x s`` block (area averaging, in
      float, after compositing).  A width or height that is not a multiple of
      ``s`` is first cropped at the right/bottom edge, so the result is
      ``w = W // s``, ``h = H // s`` and ``K / s`` (fx, fy, cx, cy) is exact
      under the pixel-centre convention: the crop does not move the origin.

    Raises :class:`DataError` naming ``path`` if the file is missing,
    unreadable, truncated, too large, or smaller than ``s`` pixels.
    """
    arr = read_image(path)  # [H, W, 3|4]
    has_alpha = arr.shape[2] == 4

    H, W = arr.shape[:2]
    s = int(downscale)
    if s < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale}")
    if H < s or W < s:
        raise DataError(f"{path}: image of {W}x{H} pixels is smaller than downscale factor {s}")

    img = torch.from_numpy(arr)  # [H, W, C]
    mask: Optional[torch.Tensor] = None
    if has_alpha:
        alpha = img[..., 3:4]  # [H, W, 1]
        img = img[..., :3] * alpha + background.view(1, 1, 3) * (1.0 - alpha)  # [H, W, 3]
        mask = alpha[..., 0].contiguous()  # [H, W]

    img = area_downscale(img, s)
    if mask is not None:
        mask = area_downscale(mask[..., None], s)[..., 0]

    return img.contiguous(), (mask.contiguous() if mask is not None else None)


#: Largest |coordinate| accepted at load (camera positions and translations,
#: points), in scene units.  float32, which training uses, spaces numbers
#: 1024 units apart at 1e10, so a larger value is a corrupt or absurd pose.
MAX_COORDINATE = 1e10


def check_pose(source: str, viewmat: np.ndarray) -> torch.Tensor:
    """A world -> camera ``[4, 4]`` (float64) checked for use: finite, a
    rotation (orthonormal, determinant +1, not a reflection), last row
    0 0 0 1, translation and camera centre within :data:`MAX_COORDINATE`.

    Returns it as a float32 tensor.  ``source`` names the file (and frame) in
    the :class:`DataError`.
    """
    V = np.asarray(viewmat, dtype=np.float64)
    if V.shape != (4, 4) or not np.all(np.isfinite(V)):
        raise DataError(f"{source}: camera pose has non-finite entries")
    R, t = V[:3, :3], V[:3, 3]
    if not np.allclose(V[3], [0, 0, 0, 1], atol=1e-6) or not np.allclose(R.T @ R, np.eye(3), atol=1e-3):
        raise DataError(f"{source}: camera pose is not rigid (rotation not orthonormal, or last row not 0 0 0 1)")
    if np.linalg.det(R) < 0:
        raise DataError(f"{source}: camera pose is a reflection (rotation with determinant -1), not a rigid motion")
    centre = -R.T @ t
    worst = float(max(np.abs(t).max(), np.abs(centre).max()))
    if worst > MAX_COORDINATE:
        raise DataError(
            f"{source}: absurd camera pose: translation of magnitude {worst:.3g} "
            f"(more than {MAX_COORDINATE:g} scene units)"
        )
    return torch.from_numpy(V).float()


def check_points(source: str, xyz: np.ndarray) -> None:
    """Initial points ``[M, 3]``: finite and within :data:`MAX_COORDINATE`."""
    xyz = np.asarray(xyz, dtype=np.float64)
    bad = ~np.all(np.isfinite(xyz) & (np.abs(np.nan_to_num(xyz, nan=np.inf)) <= MAX_COORDINATE), axis=-1)
    if bad.any():
        k = int(np.argmax(bad))
        raise DataError(
            f"{source}: point {k} (0-based, {int(bad.sum())} bad in all) has a non-finite or absurd "
            f"coordinate {xyz[k].tolist()} (limit {MAX_COORDINATE:g})"
        )


def check_intrinsics(source: str, fx: float, fy: float, cx: float, cy: float) -> None:
    """Pinhole intrinsics in pixels: finite, fx, fy > 0, all within :data:`MAX_COORDINATE`."""
    values = (fx, fy, cx, cy)
    if not all(math.isfinite(v) and abs(v) <= MAX_COORDINATE for v in values):
        raise DataError(f"{source}: non-finite or absurd intrinsics fx, fy, cx, cy = {values}")
    if not (fx > 0 and fy > 0):
        raise DataError(f"{source}: non-positive focal length ({fx}, {fy})")


def downscaled_K(K: torch.Tensor, downscale: int) -> torch.Tensor:
    """Intrinsics ``K`` [3, 3] of an image, for that image downscaled by
    ``downscale``: a new tensor, K's first two rows divided.

    With pixel centres at ``j + 0.5`` the scaling is exact: downscaled pixel
    ``J`` covers full-resolution ``[sJ, sJ + s)`` and its centre ``J + 0.5``
    maps to ``s(J + 0.5)``, so every coordinate is simply divided by ``s``.
    """
    out = K.clone()
    out[:2] /= float(downscale)
    return out


def scaled_K(fx: float, fy: float, cx: float, cy: float, downscale: int) -> torch.Tensor:
    """Intrinsics ``[3, 3]`` float32 for an image downscaled by ``downscale``
    (:func:`downscaled_K` of the full-resolution ones, in float64)."""
    K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return downscaled_K(K, downscale).float()


def holdout_split(source: str, n: int, test_every: int) -> tuple[list[int], list[int]]:
    """Indices ``(train, test)`` of ``n`` name-sorted views: every
    ``test_every``-th (0, k, 2k, ...) is held out for test, none when
    ``test_every <= 0``.  Zero training views is a :class:`DataError`
    naming ``source`` that says how to train on every view."""
    k = int(test_every) if test_every and test_every > 0 else 0
    train = [i for i in range(n) if not k or i % k]
    if not train:
        raise DataError(
            f"{source}: zero training frames ({n} frame(s), test_every={test_every} puts them all in "
            "the test split); set data.test_every=0 to train on every frame with no test split"
        )
    return train, [i for i in range(n) if k and i % k == 0]


def first_repeat(names: Iterable[str]) -> Optional[str]:
    """The first item of ``names`` seen before, or None when all differ."""
    seen = set()
    for x in names:
        if x in seen:
            return x
        seen.add(x)
    return None
