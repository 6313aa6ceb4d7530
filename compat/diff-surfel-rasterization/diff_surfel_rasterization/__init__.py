"""2DGS's ``diff_surfel_rasterization`` module, served by splat.

The classes are splat's (splat.compat.diff_surfel_rasterization); see its
docstring for the units, the layouts and where splat's definitions differ.
"""

from splat.compat.diff_surfel_rasterization import (
    GaussianRasterizationSettings,
    GaussianRasterizer,
    rasterize_gaussians,
)

__all__ = ["GaussianRasterizationSettings", "GaussianRasterizer", "rasterize_gaussians"]
