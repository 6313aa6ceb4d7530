"""INRIA 3DGS's ``diff_gaussian_rasterization`` module, served by splat.

The classes are splat's (splat.compat.diff_gaussian_rasterization); see its
docstring for the units, the layouts and where splat's definitions differ.
"""

from splat.compat.diff_gaussian_rasterization import (
    GaussianRasterizationSettings,
    GaussianRasterizer,
    rasterize_gaussians,
)

__all__ = ["GaussianRasterizationSettings", "GaussianRasterizer", "rasterize_gaussians"]
