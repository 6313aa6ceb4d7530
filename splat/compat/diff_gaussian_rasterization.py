"""INRIA 3DGS's rasterizer interface (the ``diff_gaussian_rasterization`` module) on splat's 3D Gaussians.

    from splat.compat.diff_gaussian_rasterization import GaussianRasterizationSettings, GaussianRasterizer

    rasterizer = GaussianRasterizer(GaussianRasterizationSettings(...))   # INRIA's fields, INRIA's order
    color, radii = rasterizer(means3D, means2D, opacities, shs=..., scales=..., rotations=...)
    color, radii, invdepths = ...            # when the settings name ``antialiasing`` (INRIA's current module)

``pip install --no-build-isolation ./compat/diff-gaussian-rasterization``
installs a module ``diff_gaussian_rasterization`` that is this one, so the
INRIA code and its forks run unchanged (but for their ``.cuda()`` calls).
It renders with :func:`splat.rasterize_3dgs` on the tensors' device (the
CUDA kernels on a GPU, the C++ kernels on the CPU).

What it takes, in INRIA's units and layouts
    * The camera: ``viewmatrix`` (``world_view_transform``, transposed
      world -> camera), ``projmatrix`` (``full_proj_transform``),
      ``tanfovx``/``tanfovy``, ``campos``: exactly as 2DGS's module, which
      took them from INRIA (:func:`splat.compat.inria_family.camera_from_settings`
      builds splat's K once, moving INRIA's pixel centre x = j to splat's
      j + 1/2).
    * ``scales`` [N, 3] linear standard deviations times ``scale_modifier``;
      ``rotations`` [N, 4] (w, x, y, z); ``opacities`` [N, 1] or [N].
    * ``shs`` [N, K, 3] or ``colors_precomp`` [N, 3], as 2DGS's module.
    * ``antialiasing``: Mip-Splatting's opacity compensation (INRIA's
      current module; splat's ``antialiased``).  A settings tuple built
      without the field (INRIA's original module) returns (color, radii).
    * ``means2D`` [N, 3] or [N, 2]: values unused; see its gradient below.
    * ``cov3D_precomp`` is refused with a one-line error: splat takes the
      scales and rotations that INRIA's training passes by default.

What it returns
    * ``color`` [3, H, W] = sum w c + T bg.
    * ``radii`` [N] int32: INRIA's ceil(3 sqrt(largest eigenvalue of the
      dilated 2D covariance)), 0 where splat draws nothing (so ``radii > 0``
      is the visibility filter and ``max_screen_size`` keeps its meaning).
    * ``invdepths`` [1, H, W] (with ``antialiasing`` in the settings):
      INRIA's sum_i w_i / z_i with z_i the camera z of Gaussian i's centre,
      rendered by a second pass of the same kernels (the colour channels
      carry 1 / z_i): the same definition as INRIA's, at twice the cost.
    * ``means2D.grad[:, :2]``: splat's exact dL/d(screen translation) times
      (W/2, H/2), INRIA's NDC units, so ``densify_grad_threshold`` (0.0002)
      keeps its meaning.

Where the definitions differ from INRIA's kernel
    * Far: INRIA culls nothing far away; here centres beyond 1e10 are culled.
    * Near: both cull centres at z <= 0.2; splat also skips a sample whose
      peak depth is <= 0.2.
    * Alpha clamp: min(0.99, o G) in both; splat's clamped branch has zero
      gradient.
    * Bounds: INRIA draws inside its 3-sigma radius; splat wherever
      o G >= 1/255 (a large opaque Gaussian reaches further than 3 sigma).
    * Everything splat renders beyond INRIA's outputs (peak depth, normals,
      median, distortion) is :func:`splat.rasterize_3dgs`'s.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch

from .. import conventions as cv
from ..rasterize_3dgs import rasterize_3dgs, rasterize_3dgs_and_inputs
from .inria_family import (
    CULL_FAR,
    NEAR,
    InriaRasterizer,
    camera_from_settings,
    check_inputs,
    colors_for_splat,
    describe_value,
    edge_tensors,
    functional_entry,
    run_render,
)

#: INRIA's radius: 3 standard deviations of the dilated 2D covariance.
RADIUS_SIGMAS = 3.0


class GaussianRasterizationSettings(NamedTuple):
    """INRIA's settings, field for field and in its order (``antialiasing``
    is its current module's last field; left out, the original module's
    two-output behaviour)."""

    image_height: int
    image_width: int
    tanfovx: float
    tanfovy: float
    bg: torch.Tensor  # [3]
    scale_modifier: float
    viewmatrix: torch.Tensor  # [4, 4] world_view_transform
    projmatrix: torch.Tensor  # [4, 4] full_proj_transform
    sh_degree: int
    campos: torch.Tensor  # [3]
    prefiltered: bool
    debug: bool
    antialiasing: Optional[bool] = None


def _radii_inria(kin, n, device):
    """INRIA's radii [N] int32 from the dilated conics of the drawn Gaussians."""
    radii = torch.zeros(n, dtype=torch.int32, device=device)
    c = kin["params"].detach()[:, 0:3].double()  # C_xx, C_xy, C_yy = S^-1
    det = c[:, 0] * c[:, 2] - c[:, 1] * c[:, 1]
    sxx, syy, sxy = c[:, 2] / det, c[:, 0] / det, -c[:, 1] / det  # S = C^-1
    mid = 0.5 * (sxx + syy)
    largest = mid + torch.sqrt(torch.clamp_min(mid * mid - (sxx * syy - sxy * sxy), 0.1))
    r = cv.radii_int32(torch.ceil(RADIUS_SIGMAS * torch.sqrt(largest)))
    radii[kin["ids"]] = torch.where(kin["radii"] > 0, r, torch.zeros_like(r))
    return radii


def _render(cam, settings, means3D, shs, colors_precomp, opacities, scales, rotations, cov3D_precomp, bg, want_handle):
    """(color [3, H, W], radii [N], invdepths [1, H, W] or None, the passes' pixel handles [N, 2])."""
    dtype, device = means3D.dtype, means3D.device
    n = means3D.shape[0]
    viewmat, K, opac, background = edge_tensors(cam, settings, means3D, opacities, bg)
    depth = means3D @ viewmat[2, :3] + viewmat[2, 3]  # [N] camera z of the centres
    colors, sh_degree = colors_for_splat(cam, settings, means3D, shs, colors_precomp, may_fuse=True)
    scales = scales.to(dtype) * settings.scale_modifier
    rotations = rotations.to(dtype)
    antialiased = bool(settings.antialiasing)
    out, kin = rasterize_3dgs_and_inputs(
        means3D,
        rotations,
        scales,
        opac,
        colors,
        viewmat,
        K,
        cam.width,
        cam.height,
        near=NEAR,
        far=CULL_FAR,
        background=background,
        sh_degree=sh_degree,
        antialiased=antialiased,
    )
    radii = _radii_inria(kin, n, device)
    invdepths, handles = None, (out.means2d,)
    if settings.antialiasing is not None:
        # INRIA's inverse depth: the centres' 1 / z as a colour, composited over black.
        inv = torch.where(
            depth > NEAR, 1.0 / torch.where(depth > NEAR, depth, torch.ones_like(depth)), torch.zeros_like(depth)
        )
        inv_out = rasterize_3dgs(
            means3D,
            rotations,
            scales,
            opac,
            torch.stack([inv, inv * 0, inv * 0], -1),
            viewmat,
            K,
            cam.width,
            cam.height,
            near=NEAR,
            far=CULL_FAR,
            antialiased=antialiased,
        )
        invdepths = inv_out.rgb[..., 0][None]
        handles += (inv_out.means2d,)  # its footprints move with means2D too
    return out.rgb.permute(2, 0, 1), radii, invdepths, handles


def _render_tuple(cam, settings, *tensors, want_handle):
    """_render with an image in the third place always (the autograd bridge's shape)."""
    color, radii, invdepths, handle = _render(cam, settings, *tensors, want_handle=want_handle)
    if invdepths is None:
        invdepths = color.new_zeros(1, cam.height, cam.width)
    return color, radii, invdepths, handle


def rasterize_gaussians(
    means3D: torch.Tensor,
    means2D: torch.Tensor,
    sh: Optional[torch.Tensor],
    colors_precomp: Optional[torch.Tensor],
    opacities: torch.Tensor,
    scales: Optional[torch.Tensor],
    rotations: Optional[torch.Tensor],
    cov3Ds_precomp: Optional[torch.Tensor],
    raster_settings: GaussianRasterizationSettings,
) -> tuple:
    """INRIA's functional entry (empty tensors standing for "not given" are accepted, as INRIA passes them)."""
    return functional_entry(
        GaussianRasterizer,
        means3D,
        means2D,
        sh,
        colors_precomp,
        opacities,
        scales,
        rotations,
        cov3Ds_precomp,
        raster_settings,
    )


class GaussianRasterizer(InriaRasterizer):
    """INRIA's ``GaussianRasterizer``: the module INRIA's ``render`` calls."""

    def __init__(self, raster_settings: GaussianRasterizationSettings):
        super().__init__(raster_settings)

    def forward(
        self,
        means3D: torch.Tensor,
        means2D: torch.Tensor,
        opacities: torch.Tensor,
        shs: Optional[torch.Tensor] = None,
        colors_precomp: Optional[torch.Tensor] = None,
        scales: Optional[torch.Tensor] = None,
        rotations: Optional[torch.Tensor] = None,
        cov3D_precomp: Optional[torch.Tensor] = None,
    ) -> Union[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Returns (color [3, H, W], radii [N] int32), plus invdepths [1, H, W] when the
        settings name ``antialiasing``; see the module docstring."""
        settings = self.plain_settings()
        if cov3D_precomp is not None and not (isinstance(cov3D_precomp, torch.Tensor) and cov3D_precomp.numel() == 0):
            raise ValueError(
                "cov3D_precomp: splat takes scales and rotations for 3D Gaussians, not precomputed "
                "covariances (INRIA's default: compute_cov3D_python off)"
            )
        check_inputs(
            settings,
            means3D,
            means2D,
            opacities,
            shs,
            colors_precomp,
            scales,
            rotations,
            None,
            num_scales=3,
            cov_size=6,
        )
        aa = settings.antialiasing
        if aa is not None and not isinstance(aa, bool):
            raise ValueError(f"antialiasing must be a bool, got {describe_value(aa)}")
        cam = camera_from_settings(settings)
        tensors = (means3D, shs, colors_precomp, opacities, scales, rotations, None, settings.bg)
        color, radii, invdepths = run_render(_render_tuple, cam, settings, means2D, tensors)
        return (color, radii) if aa is None else (color, radii, invdepths)
