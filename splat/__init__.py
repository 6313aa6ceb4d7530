"""splat: a differentiable 2D Gaussian surfel rasterizer with exact depth-distortion gradients.

    out = splat.rasterize(means, quats, scales, opacities, colors, viewmat, K, width, height)
    out = splat.rasterize_3dgs(means, quats, scales3, opacities, colors, viewmat, K, width, height)  # 3D Gaussians

See :func:`splat.rasterize` for the maths and :mod:`splat.conventions` for the
camera and pixel conventions used everywhere.
"""

import torch  # noqa: F401  (loads libtorch before the compiled extension)

from .outputs import RasterOutput
from .rasterize import rasterize
from .rasterize_3dgs import rasterize_3dgs
from .reference import rasterize_reference

__all__ = ["rasterize", "rasterize_3dgs", "RasterOutput", "rasterize_reference"]
__version__ = "0.1.0"
