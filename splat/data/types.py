"""The types every loader returns, and the image loading they share.

Everything here is already in splat's one camera convention (see
``splat/conventions.py``): ``viewmat`` is world -> camera in the OpenCV
convention (x right, y down, z forward), ``K`` is in pixels, and the pixel at
row ``i``, column ``j`` has its centre at ``(j + 0.5, i + 0.5)``.  Nothing past
the loaders knows any other convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["DataError", "Frame", "SceneData", "load_image", "parse_background"]


class DataError(Exception):
    """Any problem with the data on disk.

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
        return (
            f"SceneData(layout={self.layout!r}, train={len(self.train)}, "
            f"test={len(self.test)}, points={npts})"
        )


BackgroundLike = Union[Sequence[float], torch.Tensor, np.ndarray]


def parse_background(background: BackgroundLike) -> torch.Tensor:
    """Validate a background colour; returns ``[3]`` float32 in [0, 1]."""
    bg = torch.as_tensor(np.asarray(background, dtype=np.float32)).reshape(-1)
    if bg.numel() != 3:
        raise ValueError(f"background must have 3 components (RGB), got {tuple(bg.tolist())}")
    return bg


def load_image(
    path: Path, downscale: int, background: torch.Tensor
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Read an image file into ``(image [h, w, 3], mask [h, w] or None)``.

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
    unreadable, truncated, or smaller than ``s`` pixels.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: image file not found")
    try:
        with Image.open(path) as im:
            im.load()  # decode now: a truncated file raises here, not later
            has_alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
                "transparency" in im.info
            )
            im = im.convert("RGBA" if has_alpha else "RGB")
            arr = np.asarray(im, dtype=np.uint8)  # [H, W, 3|4]
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as e:
        raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from e

    H, W = arr.shape[:2]
    s = int(downscale)
    if s < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale}")
    if H < s or W < s:
        raise DataError(f"{path}: image of {W}x{H} pixels is smaller than downscale factor {s}")

    img = torch.from_numpy(arr.copy()).float().div_(255.0)  # [H, W, C]
    mask: Optional[torch.Tensor] = None
    if has_alpha:
        alpha = img[..., 3:4]  # [H, W, 1]
        img = img[..., :3] * alpha + background.view(1, 1, 3) * (1.0 - alpha)  # [H, W, 3]
        mask = alpha[..., 0].contiguous()  # [H, W]

    if s > 1:
        def pool(x: torch.Tensor) -> torch.Tensor:  # [H, W, C] -> [H//s, W//s, C]
            return F.avg_pool2d(x.permute(2, 0, 1)[None], kernel_size=s, stride=s)[0].permute(1, 2, 0)

        img = pool(img)
        if mask is not None:
            mask = pool(mask[..., None])[..., 0]

    return img.contiguous(), (mask.contiguous() if mask is not None else None)


def scaled_K(fx: float, fy: float, cx: float, cy: float, downscale: int) -> torch.Tensor:
    """Intrinsics ``[3, 3]`` float32 for an image downscaled by ``downscale``.

    With pixel centres at ``j + 0.5`` the scaling is exact: downscaled pixel
    ``J`` covers full-resolution ``[sJ, sJ + s)`` and its centre ``J + 0.5``
    maps to ``s(J + 0.5)``, so every coordinate is simply divided by ``s``.
    """
    s = float(downscale)
    K = torch.tensor(
        [[fx / s, 0.0, cx / s], [0.0, fy / s, cy / s], [0.0, 0.0, 1.0]], dtype=torch.float64
    )
    return K.float()
