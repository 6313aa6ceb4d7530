"""The rasterizer's output type and the final per-pixel composition shared by all backends."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RasterOutput:
    """What :func:`splat.rasterize` returns.  H, W are the image size, N the number of surfels.

    Attributes:
        rgb: [H, W, 3] colour composited over the background: sum w c + T bg.
        alpha: [H, W] 1 - final transmittance T.
        depth: [H, W] expected depth sum w z / alpha (camera z); 0 where alpha == 0.
        median_depth: [H, W] z of the last surfel entered with T > 0.5; 0 if none.
        normal: [H, W, 3] sum w n, world space, each n flipped to face the camera.
        distortion: [H, W] sum_i sum_{j<i} w_i w_j (m_i - m_j)^2, m(z) = far / (far - near) (1 - near / z).
        radii: [N] int32 screen radius in pixels of the bounding box; 0 = not drawn; at most
            ``conventions.RADIUS_MAX`` (a footprint wider than any image).
        means2d: [N, 2] projected centres in pixels; after ``backward()`` its ``.grad`` is
            dL/d(screen translation of each footprint), the densification signal.
    """

    rgb: torch.Tensor  # [H, W, 3] colour composited over the background
    alpha: torch.Tensor  # [H, W] 1 - final transmittance
    depth: torch.Tensor  # [H, W] sum w z / alpha (camera z); 0 where alpha == 0
    median_depth: torch.Tensor  # [H, W] z of the last surfel entered with T > 0.5; 0 if none
    normal: torch.Tensor  # [H, W, 3] sum w n, world space, each n facing the camera
    distortion: torch.Tensor  # [H, W] sum_i sum_{j<i} w_i w_j (m_i - m_j)^2
    radii: torch.Tensor  # [N] int32 screen radius in pixels of the bounding box; 0 = not drawn
    means2d: torch.Tensor  # [N, 2] projected centres; .grad = dL/d(screen translation), pixels


def compose(
    color_sum, transmittance, depth_sum, normal_sum, distortion, median_depth, background, radii, means2d
) -> RasterOutput:
    """Turns the kernels' raw per-pixel sums into the public outputs.

    rgb = sum w c + T * background, alpha = 1 - T, depth = sum w z / alpha.
    """
    alpha = 1.0 - transmittance  # [H, W]
    rgb = color_sum
    if background is not None:
        rgb = rgb + transmittance.unsqueeze(-1) * background
    covered = alpha > 0
    # The safe denominator keeps 0/0 out of the graph: where() alone would
    # still send NaN gradients through the unused branch.
    depth = torch.where(
        covered, depth_sum / torch.where(covered, alpha, torch.ones_like(alpha)), torch.zeros_like(alpha)
    )
    return RasterOutput(
        rgb=rgb,
        alpha=alpha,
        depth=depth,
        median_depth=median_depth,
        normal=normal_sum,
        distortion=distortion,
        radii=radii,
        means2d=means2d,
    )
