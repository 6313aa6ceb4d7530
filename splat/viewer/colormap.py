"""What the viewer shows of a render: RGB, or one of the geometric outputs through a colour map.

Every mode is computed from one ``splat.rasterize`` output; :func:`visualize`
returns the 8-bit picture and the value range the colour map spans (shown on
the page next to a colour bar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional, Tuple

import numpy as np
import torch

if TYPE_CHECKING:
    from ..outputs import RasterOutput

#: Page label -> (rasterizer output, unit shown with the range).
MODES = {
    "RGB": ("rgb", ""),
    "Expected depth": ("depth", "scene units, camera z"),
    "Median depth": ("median_depth", "scene units, camera z"),
    "Normals": ("normal", "world xyz -> rgb"),
    "Alpha": ("alpha", ""),
    "Distortion": ("distortion", ""),
}
COLORMAPS = ("turbo", "gray", "inferno")

# Turbo (Mikhailov 2019), polynomial fit of the published table.
_TURBO = np.array(
    [
        [0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943],
        [0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604],
        [0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973],
    ]
)
# Inferno: 9 anchors of matplotlib's table, linearly interpolated.
_INFERNO = np.array(
    [
        [0.0015, 0.0005, 0.0139],
        [0.0871, 0.0449, 0.2246],
        [0.2582, 0.0386, 0.4065],
        [0.4162, 0.0902, 0.4329],
        [0.5783, 0.1480, 0.4044],
        [0.7357, 0.2156, 0.3302],
        [0.8650, 0.3165, 0.2262],
        [0.9540, 0.4669, 0.1008],
        [0.9882, 0.6450, 0.0399],
        [0.9646, 0.8437, 0.2738],
        [0.9884, 0.9984, 0.6449],
    ]
)


def apply_colormap(t: np.ndarray, name: str) -> np.ndarray:
    """Colours [..., 3] float32 in [0, 1] of values ``t`` (clipped to [0, 1])."""
    t = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
    if name == "gray":
        c = np.repeat(t[..., None], 3, axis=-1)
    elif name == "turbo":
        powers = np.stack([t**k for k in range(6)], axis=-1)  # [..., 6]
        c = powers @ _TURBO.T
    elif name == "inferno":
        x = t * (len(_INFERNO) - 1)
        i = np.minimum(x.astype(int), len(_INFERNO) - 2)
        f = (x - i)[..., None]
        c = _INFERNO[i] * (1 - f) + _INFERNO[i + 1] * f
    else:
        raise ValueError(f"unknown colour map {name!r} (one of {', '.join(COLORMAPS)})")
    return np.clip(c, 0.0, 1.0).astype(np.float32)


def colorbar(name: str, width: int = 256, height: int = 12) -> np.ndarray:
    """A horizontal colour bar, uint8 [height, width, 3], low values left."""
    row = apply_colormap(np.linspace(0.0, 1.0, width), name)
    return (np.repeat(row[None], height, axis=0) * 255 + 0.5).astype(np.uint8)


@dataclass
class Picture:
    image: np.ndarray  # uint8 [H, W, 3]
    lo: Optional[float] = None  # value at the colour map's low end (None: no colour map)
    hi: Optional[float] = None


def auto_range(values: np.ndarray, valid: np.ndarray) -> Tuple[float, float]:
    """2nd..98th percentile of ``values[valid]`` ((0, 1) if nothing is valid)."""
    v = values[valid]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(v, [2.0, 98.0])
    if not hi > lo:
        hi = lo + max(abs(float(lo)) * 1e-3, 1e-6)
    return float(lo), float(hi)


def to_uint8(rgb: np.ndarray) -> np.ndarray:
    return (np.clip(rgb, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def visualize(
    out: RasterOutput,
    mode: str,
    background: torch.Tensor,
    cmap: str = "turbo",
    value_range: Optional[Tuple[float, float]] = None,
) -> Picture:
    """The picture of mode ``mode`` (a key of :data:`MODES`) of a rasterizer output ``out``.

    Geometric modes are drawn where alpha > 0 (blended over ``background`` by
    alpha, like the RGB image); ``value_range`` (default: automatic, see
    :func:`auto_range`) is mapped onto the colour map."""
    field, _ = MODES[mode]
    bg = np.asarray(background, dtype=np.float32).reshape(1, 1, 3)
    if field == "rgb":
        return Picture(to_uint8(out.rgb.detach().float().cpu().numpy()))
    alpha = out.alpha.detach().float().cpu().numpy()[..., None]  # [H, W, 1]
    if field == "normal":
        n = out.normal.detach().float().cpu()
        n = (n / n.norm(dim=-1, keepdim=True).clamp_min(1e-12)).numpy()
        return Picture(to_uint8((n * 0.5 + 0.5) * alpha + bg * (1 - alpha)))
    values = getattr(out, field).detach().float().cpu().numpy()  # [H, W]
    if field == "alpha":
        lo, hi = value_range or (0.0, 1.0)
        t = (values - lo) / max(hi - lo, 1e-12)
        return Picture(to_uint8(apply_colormap(t, cmap)), lo, hi)
    valid = alpha[..., 0] > 0
    lo, hi = value_range or auto_range(values, valid)
    colour = apply_colormap((values - lo) / max(hi - lo, 1e-12), cmap)
    return Picture(to_uint8(colour * alpha + bg * (1 - alpha)), lo, hi)


def describe_range(mode: str, cmap: str, pic: Picture) -> str:
    """One line for the page, e.g. ``turbo: 2.31 .. 5.8 (scene units, camera z)``."""
    if pic.lo is None:
        return MODES[mode][1] or "RGB over the background"
    unit = MODES[mode][1]
    return f"{cmap}: {pic.lo:.4g} .. {pic.hi:.4g}" + (f" ({unit})" if unit else "")


def to_tensor_bg(background: Iterable[float]) -> torch.Tensor:
    return torch.tensor(list(background), dtype=torch.float32).reshape(3)
