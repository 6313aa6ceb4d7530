"""2DGS's rasterizer interface (the ``diff_surfel_rasterization`` module) on splat's kernels.

    from splat.compat.diff_surfel_rasterization import GaussianRasterizationSettings, GaussianRasterizer

    rasterizer = GaussianRasterizer(GaussianRasterizationSettings(...))   # 2DGS's fields, 2DGS's order
    color, radii, allmap = rasterizer(means3D, means2D, opacities, shs=..., scales=..., rotations=...)

``pip install --no-build-isolation ./compat/diff-surfel-rasterization`` installs
a module ``diff_surfel_rasterization`` that is this one, so 2DGS and its forks
run unchanged (but for their ``.cuda()`` calls).  It runs on the tensors'
device: splat's CUDA kernels for CUDA tensors, its C++ kernels for CPU ones.

What it takes, in 2DGS's units and layouts
    * ``viewmatrix``: 2DGS's ``world_view_transform``, world -> camera with
      OpenCV axes, transposed (row vectors: the translation is its last row).
      splat's ``viewmat`` is its transpose.
    * ``projmatrix``: ``full_proj_transform`` = ``world_view_transform @
      projection_matrix`` (transposed too).  The projection P = (viewmatrix^-1
      projmatrix)^T must be a pinhole whose w is the camera z; its z row is
      never used (2DGS's kernel drops it too).  ``tanfovx``/``tanfovy`` must
      agree with it (P00 tanfovx = 1, P11 tanfovy = 1, to 1e-4).
    * K, built here once, in splat's pixel convention (centre of column j at
      x = j + 1/2; 2DGS's kernel puts it at x = j):
          fx = W / (2 tanfovx),  fy = H / (2 tanfovy),
          cx = W/2 (1 + P02),    cy = H/2 (1 + P12),   skew = W/2 P01,
      so 2DGS's own cameras (P02 = P12 = 0) give the image centre (W/2, H/2),
      and forks that shift the principal point through P are honoured.
      Offsets and skews below 0.01 px are float32 rounding of projmatrix and
      are taken as 0.
    * ``scales`` [N, 2] linear standard deviations (2DGS's ``get_scaling``),
      multiplied by ``scale_modifier``; ``rotations`` [N, 4] quaternions
      (w, x, y, z); ``opacities`` [N, 1] or [N] in [0, 1].
    * ``shs`` [N, K >= (sh_degree + 1)^2, 3] (2DGS's ``get_features``: the DC
      coefficient first), colour = max(SH(dir) + 0.5, 0) with dir the unit
      vector from ``campos`` to the mean; or ``colors_precomp`` [N, 3].
    * ``cov3D_precomp`` [N, 9]: 2DGS's precomputed splat-to-pixel transform, the
      rows Tu, Tv, Tw of M = [a b c] mapped to 2DGS's pixels (see
      ``gaussian_renderer/__init__.py``, ``compute_cov3D_python``).  Shifted
      here by half a pixel to splat's convention (Tu += Tw / 2, Tv += Tw / 2).
      ``scale_modifier`` does not apply to it (2DGS folds it in when building
      the transform); ``means3D`` still culls, sorts and gives the SH direction.
    * ``prefiltered``: as in 2DGS a promise that no mean lies at camera
      z <= 0.2; broken, it raises (2DGS's kernel traps).  ``debug``: on an
      error, the inputs are saved to ``snapshot_fw.dump`` / ``snapshot_bw.dump``
      in the working directory, as 2DGS does, and the error is raised.
    * ``means2D`` [N, 2] or [N, 3]: values unused (2DGS passes zeros); its
      gradient is filled, see below.

What it returns
    * ``color`` [3, H, W]: sum w c + T bg.
    * ``radii`` [N] int32: 2DGS's screen radius, ceil(max(half-extents of the
      bounding box of u^2 + v^2 <= 9, 3/sqrt(2))) pixels, so that 2DGS's
      ``max_screen_size`` (20) means the same; 0 where splat draws nothing
      (``radii > 0`` is 2DGS's visibility filter; unlike 2DGS it leaves out
      surfels too faint to reach alpha 1/255 anywhere, which 2DGS counts as
      seen with a zero gradient).  A surfel whose ellipse reaches the camera
      plane gets max(W, H).
    * ``allmap`` [7, H, W], each channel what 2DGS's renderer reads from it:
          0    sum w z             not normalised (the renderer divides by alpha)
          1    alpha = 1 - T
          2:5  sum w n             view-space normals facing the camera, not
                                   normalised (the renderer rotates them to world)
          5    median depth        z of the last surfel entered with T > 0.5; 0 if none
          6    distortion          sum_i sum_{j<i} w_i w_j (m_i - m_j)^2,
                                   m(z) = 100/99.8 (1 - 0.2/z) (2DGS's near 0.2, far 100)
    * ``means2D.grad[:, :2]``: splat's exact dL/d(screen translation of the
      footprint) in 2DGS's NDC units, the pixel gradient times (W/2, H/2), so
      that 2DGS's ``densify_grad_threshold`` (0.0002) has its units;
      ``means2D.grad[:, 2:]`` is 0.

Where the definitions differ from 2DGS's kernel (docs/porting.md has the detail)
    * Low-pass centre: splat's screen-space fallback rho_2d = 2 |p - centre|^2
      is centred on the projected 3D centre K c / c_z; 2DGS centres it on the
      centre of the 3-sigma bounding box, which differs for a tilted surfel.
    * Low-pass depth: where the fallback wins, splat's sample depth is the
      centre's c_z; 2DGS uses the ray-plane intersection, which for a
      sub-pixel or edge-on surfel is far from the surfel.
    * Per-sample near test: splat skips a sample at z <= 0.2, 2DGS at z < 0.2
      (with its intersection depth, also in the fallback).  An edge-on surfel
      (q2 = 0, or its normal at right angles to the view ray) is culled by 2DGS
      and drawn by its fallback in splat.
    * Far: 2DGS culls nothing far away; splat culls centres at z >= far, so
      the shim renders with far = 1e10 and rescales the distortion to 2DGS's
      m(z) exactly (m scales linearly with far / (far - near)).
    * Alpha clamp: min(0.99, o G) in both; splat gives the clamped branch
      zero gradient, 2DGS passes dL/dalpha to o and G through the clamp.
    * Distortion form: the same (2DGS's), with the same near and far.
    * ``means2D`` gradient: 2DGS overwrites it with dL/dTu_z * c_z * W/2 from
      the 3D branch only, which drops the low-pass pixels (most of a small
      surfel's signal) and the a_z, b_z terms of a tilted one.  splat's is the
      exact translation gradient.  Same units, so the threshold keeps its
      meaning; a model with many sub-pixel surfels densifies more.
    * Other gradients 2DGS gets wrong: with ``scale_modifier`` != 1 its
      backward rebuilds the transform with modifier 1; in the fallback its
      depth gradient ignores how the intersection moves with the surfel.
      splat's gradients are exact everywhere.
    * ``cov3D_precomp``: 2DGS writes the constant normal (0, 0, -1) and no
      normal gradient; splat uses the transform's own normal, a x b from
      K^-1 M, facing the camera, with its gradient.
    * Hyper-parameters: ``lambda_dist``, ``lambda_normal``,
      ``densify_grad_threshold``, ``opacity_cull`` and ``max_screen_size``
      keep 2DGS's meaning and need no conversion.

An argument splat cannot honour raises a one-line error naming it.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from .. import conventions as cv
from .._backend import has_cuda_kernels, has_extension
from ..geometry import quat_to_rotmat
from ..outputs import compose
from ..rasterize import _check_magnitude, _RasterizeSurfels, _screen_bounds, depth_in_range, rasterize
from .inria_family import (
    CULL_FAR,
    NEAR,
    Camera,
    InriaRasterizer,
    camera_from_settings,
    check_inputs,
    colors_for_splat,
    edge_tensors,
    functional_entry,
    run_render,
)

#: 2DGS's kernel constant far_n: the far end of the distortion's normalised
#: depth m(z) (its near_n is NEAR).
FAR = 100.0
#: m(z) = far / (far - near) (1 - near / z) is linear in far / (far - near):
#: the distortion, quadratic in m, converts by the squared ratio.
DISTORTION_SCALE = ((FAR / (FAR - NEAR)) / (CULL_FAR / (CULL_FAR - NEAR))) ** 2
#: 2DGS's radius: the 3-sigma box (cutoff 3), at least cutoff * FilterSize px.
RADIUS_CUTOFF = 3.0
RADIUS_MIN = RADIUS_CUTOFF * math.sqrt(0.5)


class GaussianRasterizationSettings(NamedTuple):
    """2DGS's settings, field for field and in its order."""

    image_height: int
    image_width: int
    tanfovx: float
    tanfovy: float
    bg: torch.Tensor  # [3]
    scale_modifier: float
    viewmatrix: torch.Tensor  # [4, 4] world_view_transform (transposed world -> camera)
    projmatrix: torch.Tensor  # [4, 4] full_proj_transform
    sh_degree: int
    campos: torch.Tensor  # [3]
    prefiltered: bool
    debug: bool


# ---------------------------------------------------------------------------
# The renderer
# ---------------------------------------------------------------------------
def _radii_2dgs(M, drawn_radii, width, height):
    """2DGS's radii [N] int32 from splat's screen matrices M [N, 3, 3].

    The 3-sigma ellipse u^2 + v^2 <= 9 has the dual conic C* = M diag(1, 1, -1/9) M^T;
    its bounding box is centred at C*_{k2} / C*_22 with half-extents
    sqrt((C*_{k2} / C*_22)^2 - C*_kk / C*_22) (k = 0, 1), floored at 1e-4 under
    the root as in 2DGS.  Surfels splat does not draw keep radius 0; an
    ellipse reaching the camera plane (C*_22 >= 0) has no box: max(W, H).
    """
    M = M.detach().double()
    dual = (M * M.new_tensor([1.0, 1.0, -1.0 / RADIUS_CUTOFF**2])) @ M.transpose(1, 2)  # [N, 3, 3]
    c22 = dual[:, 2, 2]
    bounded = c22 < 0
    c22 = torch.where(bounded, c22, -torch.ones_like(c22))
    mid = dual[:, :2, 2] / c22[:, None]  # [N, 2]
    diag = torch.stack([dual[:, 0, 0], dual[:, 1, 1]], -1) / c22[:, None]
    half = torch.sqrt(torch.clamp_min(mid * mid - diag, 1e-4)).amax(-1)  # [N]
    radius = torch.ceil(torch.clamp_min(half, RADIUS_MIN))
    radius = torch.where(bounded, radius, torch.full_like(radius, float(max(width, height))))
    drawn = drawn_radii.to(radius.device) > 0
    return cv.radii_int32(torch.where(drawn, radius, torch.zeros_like(radius)))


def _screen_matrices(means, quats, scales, viewmat, K):
    """M = K [a b c] [N, 3, 3] (a = s_u R t_u, b = s_v R t_v, c the camera-space centre), no gradient."""
    with torch.no_grad():
        rot = viewmat[:3, :3] @ quat_to_rotmat(quats)  # [N, 3, 3]
        c = means @ viewmat[:3, :3].T + viewmat[:3, 3]  # [N, 3]
        cols = torch.stack([rot[:, :, 0] * scales[:, :1], rot[:, :, 1] * scales[:, 1:2], c], dim=-1)
        return K @ cols


def _rasterize_transforms(cam, transforms, means3D, colors, opacities, background, viewmat, K, want_handle):
    """splat's rasterization of 2DGS's precomputed transforms [N, 9].

    The transform is splat's M in 2DGS's pixels; a half-pixel shift makes it
    splat's.  Normals are the transform's own: the columns of K^-1 M are
    (a, b, c), the camera-space normal is a x b / |a x b|, flipped to face the
    camera (n . c < 0).  Returns (RasterOutput with camera-space normals, M).
    """
    n = means3D.shape[0]
    width, height = cam.width, cam.height
    shift = transforms.new_tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    M = shift @ transforms.reshape(n, 3, 3)  # [N, 3, 3] rows Tu, Tv, Tw in splat's pixels
    depth = (means3D.detach() @ viewmat[:3, :3].T + viewmat[:3, 3])[:, 2]  # [N] sorts, as 2DGS's p_view.z
    in_range = depth_in_range(depth, NEAR, CULL_FAR) & depth_in_range(M[:, 2, 2], NEAR, CULL_FAR)
    # Zero the culled rows before any division (no 0 * inf in their gradients).
    M = torch.where(in_range[:, None, None], M, torch.zeros_like(M))
    _check_magnitude(M.detach(), in_range, None, width, height)
    safe_z = torch.where(in_range, M[:, 2, 2], torch.ones_like(M[:, 2, 2]))
    center = M[:, :2, 2] / safe_z[:, None]  # [N, 2]
    cols = torch.linalg.solve(K, M)  # [N, 3, 3] columns a, b, c in camera space
    normal = torch.linalg.cross(cols[:, :, 0], cols[:, :, 1])  # [N, 3]
    normal = normal / torch.clamp_min(normal.norm(dim=-1, keepdim=True), torch.finfo(M.dtype).tiny ** 0.5)
    away = (normal * cols[:, :, 2]).sum(-1, keepdim=True) > 0
    normal = torch.where(away, -normal, normal)
    with torch.no_grad():
        rect, radii = _screen_bounds(M.detach(), center.detach(), opacities.detach(), in_range, width, height)
        drawn = (rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])
    _check_magnitude(M.detach(), in_range, drawn, width, height)
    handle = center.detach().clone()
    Tuvw = M.reshape(n, 9)
    if want_handle:
        # A screen translation of value 0 and gradient 1, as in splat.rasterize.
        handle.requires_grad_(True)
        delta = handle - handle.detach()
        Tu, Tv, Tw = Tuvw[:, 0:3], Tuvw[:, 3:6], Tuvw[:, 6:9]
        Tuvw = torch.cat([Tu + delta[:, :1] * Tw, Tv + delta[:, 1:] * Tw, Tw], dim=1)
        center = center + delta
    sums = _RasterizeSurfels.apply(
        Tuvw, center, normal, colors, opacities, depth.contiguous(), rect, width, height, NEAR, CULL_FAR
    )
    return compose(*sums, background=background, radii=radii, means2d=handle), M


def _render(
    cam: Camera, settings, means3D, shs, colors_precomp, opacities, scales, rotations, cov3D_precomp, bg, want_handle
):
    """(color [3, H, W], radii [N], allmap [7, H, W], means2d [N, 2] pixel handle)."""
    dtype, device = means3D.dtype, means3D.device
    n = means3D.shape[0]
    viewmat, K, opac, background = edge_tensors(cam, settings, means3D, opacities, bg)
    precomp = cov3D_precomp is not None and n > 0
    colors, sh_degree = colors_for_splat(cam, settings, means3D, shs, colors_precomp, may_fuse=not precomp)
    if precomp:
        if not (has_cuda_kernels() if means3D.is_cuda else has_extension()):
            raise RuntimeError(
                f"cov3D_precomp needs splat's compiled kernels for {device.type} tensors, "
                "which are unavailable (scales and rotations work without them)"
            )
        out, M = _rasterize_transforms(
            cam, cov3D_precomp.to(dtype), means3D, colors, opac, background, viewmat, K, want_handle
        )
        normal_view = out.normal  # [H, W, 3] already camera space
    else:
        if cov3D_precomp is not None:  # N = 0: nothing to transform
            scales, rotations = means3D.new_zeros(0, 2), means3D.new_zeros(0, 4) + 1
        scales = scales.to(dtype) * settings.scale_modifier
        rotations = rotations.to(dtype)
        out = rasterize(
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
        )
        normal_view = out.normal @ viewmat[:3, :3].T  # [H, W, 3] world -> camera
        M = _screen_matrices(means3D.detach(), rotations.detach(), scales.detach(), viewmat, K)
    radii = _radii_2dgs(M, out.radii, cam.width, cam.height)
    allmap = torch.cat(
        [
            (out.depth * out.alpha)[None],  # sum w z: splat's depth is that over alpha
            out.alpha[None],
            normal_view.permute(2, 0, 1),
            out.median_depth[None],
            (out.distortion * DISTORTION_SCALE)[None],
        ],
        dim=0,
    )
    return out.rgb.permute(2, 0, 1), radii, allmap, out.means2d


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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2DGS's functional entry (empty tensors standing for "not given" are accepted, as 2DGS passes them)."""
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
    """2DGS's ``GaussianRasterizer``: the module 2DGS's ``render`` calls."""

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
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (color [3, H, W], radii [N] int32, allmap [7, H, W]); see the module docstring."""
        settings = self.plain_settings()
        check_inputs(settings, means3D, means2D, opacities, shs, colors_precomp, scales, rotations, cov3D_precomp)
        cam = camera_from_settings(settings)
        tensors = (means3D, shs, colors_precomp, opacities, scales, rotations, cov3D_precomp, settings.bg)
        return run_render(_render, cam, settings, means2D, tensors)
