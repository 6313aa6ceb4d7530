"""The one home of splat's constants and camera conventions.

Cameras
    ``viewmat`` is world -> camera in the OpenCV convention: x right, y down,
    z forward.  ``K`` holds intrinsics in pixels.  The pixel at row ``i``,
    column ``j`` has its centre at ``(j + 0.5, i + 0.5)``.  Loaders convert every
    data-set convention to this one at the edge; nothing past a loader knows
    any other.

Depth
    Camera-space z.  The depth-distortion loss uses the normalised depth
    ``m(z) = far / (far - near) * (1 - near / z)``.

The same numbers appear in ``kernels/core.h`` (the kernels cannot
import Python).  ``tests/test_conventions.py`` parses that header and checks
that both agree, so they cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Upper clamp of a surfel's alpha, so that 1 - alpha never reaches 0 and the
#: backward pass can divide by it.
ALPHA_MAX = 0.99
#: A surfel whose alpha is below this at a pixel is skipped there.
ALPHA_MIN = 1.0 / 255.0
#: A pixel stops blending once its transmittance would fall below this.
TRANSMITTANCE_MIN = 1e-4
#: Median depth: the last surfel whose incoming transmittance is above this.
MEDIAN_TRANSMITTANCE = 0.5
#: Screen-space low-pass filter: rho_2d = LOWPASS_INV_VARIANCE * |pixel - centre|^2
#: (a Gaussian of standard deviation 1/sqrt(2) pixels, as in 2DGS).
LOWPASS_INV_VARIANCE = 2.0
#: 3D Gaussians: EWA splatting adds this to the projected 2D covariance (px^2),
#: so that every footprint covers about a pixel (3DGS, gsplat's ``eps2d``).
EWA_DILATION = 0.3
#: Tile edge in pixels.
TILE_SIZE = 16
#: Spherical-harmonic colours are offset by this before clamping at 0 (3DGS/gsplat).
SH_COLOR_OFFSET = 0.5
#: Largest screen radius reported (``RasterOutput.radii``, the drop-ins'
#: radii), in pixels: a footprint larger than any image (a huge primitive, or
#: one close to the camera) is reported as this, so that the int32 radii
#: never overflow to negative values.  Radii carry no gradient, so the clamp
#: changes nothing that is differentiated; what is drawn is bounded by the
#: pixel rectangles, which are clamped to the screen anyway.
RADIUS_MAX = 1 << 30


def pixel_centers_offset() -> float:
    """Offset from a pixel's integer index to its centre, in pixels."""
    return 0.5


def normalized_depth(z: float | torch.Tensor, near: float, far: float) -> float | torch.Tensor:
    """m(z) = far/(far-near) * (1 - near/z): 0 at the near plane, 1 at the far plane."""
    return far / (far - near) * (1.0 - near / z)


def radii_int32(radii: torch.Tensor) -> torch.Tensor:
    """Screen radii (float, >= 0, possibly huge or inf) as int32, clamped to :data:`RADIUS_MAX`."""
    return radii.clamp(max=float(RADIUS_MAX)).int()  # .int(): int32, and no torch import here
