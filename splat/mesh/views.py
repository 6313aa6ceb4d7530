"""The per-view depth and colour that meshing fuses.

Each train view is rendered once.  The fused depth is 2DGS's ``depth_ratio``
mix of the two depths the rasterizer returns,

    z = (1 - depth_ratio) * z_expected + depth_ratio * z_median,

where ``z_expected = sum_i w_i z_i / alpha`` (smooth, but averaged across
surfaces at silhouettes) and ``z_median`` is the z of the surfel at which the
transmittance crosses 0.5 (on one surface, but noisier).  Pixels with
``alpha < alpha_min`` get z = 0, "no measurement": a pixel that is mostly
background marks no surface, and fusing its depth is what smears
silhouettes and builds sheets behind them.

The visibility test of :mod:`splat.mesh.cleanup` uses the nearer of the two
depths instead (``front_depth``): where they disagree, the expected depth is
pulled back by faint surfels behind the surface, and a surface hidden behind
the true one would pass for seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

from ..data.background import configured_background
from ..geometry import project_points
from ..progress import use_progress_bar

if TYPE_CHECKING:
    from ..data.types import Frame
    from ..model import GaussianModel


@dataclass
class FusionView:
    """One camera's measurement, in splat's camera convention (conventions.py)."""

    rgb: np.ndarray  # [H, W, 3] float32 in [0, 1]
    depth: np.ndarray  # [H, W] float32 camera-space z; 0 = no measurement
    K: np.ndarray  # [3, 3] float64, pixel (i, j) centred at (j + 0.5, i + 0.5)
    viewmat: np.ndarray  # [4, 4] float64 world -> camera (OpenCV axes)
    #: [H, W] float32 the nearest depth the view supports, min(expected, median)
    #: (0 = none), for the visibility test of cleanup.py; None: ``depth``.
    front_depth: Optional[np.ndarray] = None

    @property
    def visibility_depth(self) -> np.ndarray:
        return self.depth if self.front_depth is None else self.front_depth

    @property
    def height(self) -> int:
        return int(self.depth.shape[0])

    @property
    def width(self) -> int:
        return int(self.depth.shape[1])


def pixel_lookup(
    points: torch.Tensor, viewmat: torch.Tensor, K: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where world ``points`` [M, 3] land in a view: (camera z [M], inside [M]
    bool: in front and within the image, flat pixel index ``row * width + col``
    [K] of the inside points).  Pixel (i, j) covers [j, j+1) x [i, i+1)
    (conventions.py).  viewmat [4, 4], K [3, 3], in the points' dtype."""
    uv, z = project_points(points, viewmat[None], K[None])
    uv, z = uv[0], z[0]  # [M, 2], [M]
    col, row = torch.floor(uv[:, 0]), torch.floor(uv[:, 1])
    inside = (z > 0) & (col >= 0) & (row >= 0) & (col < width) & (row < height)
    return z, inside, (row[inside] * width + col[inside]).long()


def fused_depth(
    expected: torch.Tensor, median: torch.Tensor, alpha: torch.Tensor, depth_ratio: float, alpha_min: float
) -> torch.Tensor:
    """``(1 - r) z_expected + r z_median`` where ``alpha >= alpha_min``, else 0. All [H, W]."""
    if not 0.0 <= depth_ratio <= 1.0:
        raise ValueError(f"depth_ratio: {depth_ratio} is not in [0, 1]")
    z = (1.0 - depth_ratio) * expected + depth_ratio * median
    keep = (alpha >= alpha_min) & (z > 0) & torch.isfinite(z)
    return torch.where(keep, z, torch.zeros_like(z))


def render_fusion_views(
    model: GaussianModel,
    cfg: dict,
    frames: Sequence[Frame],
    depth_ratio: float,
    alpha_min: float,
    progress: bool | str = "auto",
) -> list[FusionView]:
    """Render ``frames`` with ``model`` under the run's render settings (``cfg["render"]``).

    Colour is rendered over the config's background, as the model was trained."""
    from ..model_render import render_frame

    r = cfg["render"]
    background = torch.tensor(configured_background(cfg["data"]), dtype=torch.float32)
    it = frames
    if use_progress_bar(progress):
        from tqdm import tqdm

        it = tqdm(frames, desc="render views for meshing", dynamic_ncols=True)
    views = []
    for f in it:
        with torch.no_grad():
            out = render_frame(model, f, background, backend=r["backend"], near=r["near"], far=r["far"])
        alpha = out.alpha.detach().cpu().float()
        z = fused_depth(
            out.depth.detach().cpu().float(), out.median_depth.detach().cpu().float(), alpha, depth_ratio, alpha_min
        )
        expected, median = out.depth.detach().cpu().float(), out.median_depth.detach().cpu().float()
        front = fused_depth(torch.minimum(expected, median), median, alpha, 0.0, alpha_min)
        views.append(
            FusionView(
                rgb=out.rgb.detach().cpu().float().clamp(0, 1).numpy(),
                depth=z.numpy().astype(np.float32),
                front_depth=front.numpy().astype(np.float32),
                K=f.K.double().cpu().numpy(),
                viewmat=f.viewmat.double().cpu().numpy(),
            )
        )
    return views
