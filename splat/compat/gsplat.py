"""gsplat 1.5's ``rasterization_2dgs`` and ``rasterization`` (3DGS), computed by splat.

A gsplat-based trainer switches by changing one import::

    from splat.compat.gsplat import rasterization_2dgs   # was: from gsplat import rasterization_2dgs
    from splat.compat.gsplat import rasterization        # was: from gsplat import rasterization

``rasterization`` (3D Gaussians, :func:`splat.rasterize_3dgs`) is described
in its own docstring; the rest of this one is about ``rasterization_2dgs``.

The signature, the argument layouts, the returned tuple and the ``meta``
dictionary that gsplat's ``DefaultStrategy(key_for_gradient="gradient_2dgs")``
reads are gsplat 1.5.0's (1.5.3 adds leading batch dimensions, refused here).
What is rendered is splat's: :func:`splat.rasterize` per camera, with its exact
gradients, any principal point and skew, and a CPU backend.

Layouts (C cameras, N surfels, H x W pixels)::

    render_colors   [C, H, W, 3] "RGB", [C, H, W, 1] "D"/"ED", [C, H, W, 4] "RGB+D"/"RGB+ED"
    render_alphas   [C, H, W, 1]  1 - T
    render_normals  [C, H, W, 3]  sum_i w_i n_i, world frame, not normalised
    surf_normals    [C, H, W, 3]  from the rendered depth, world frame (gsplat squeezes
                                  dim 0, so [H, W, 3] for C = 1); None unless "RGB+D"/"RGB+ED"
    render_distort  [C, H, W, 1]  splat's distortion (see below)
    render_median   [C, H, W, 1]  median depth

with w_i = alpha_i T_i.  "D" is the accumulated depth sum_i w_i z_i, "ED" the
expected depth sum_i w_i z_i / (1 - T).

Where splat's definitions differ from gsplat's 2DGS kernels (v1.5.0,
``gsplat/cuda/csrc/*2DGS*``):

* Low-pass centre.  Both fall back to exp(-|p - centre|^2) (2 / px^2
  inverse variance) where it is larger than the ray-surfel Gaussian.  gsplat
  centres it, and ``meta["means2d"]``, on the centre of the projected
  ellipse's bounding box; splat on the projected 3D centre K x_cam / z.  They
  differ for a surfel seen at an angle.
* Alpha clamp.  alpha = min(0.99, o G) here (2DGS's and INRIA's value);
  gsplat clamps at 0.999, so an opaque surfel passes 1 % of the light here
  and 0.1 % there.
* Depth.  Each sample's depth is the camera z of the ray-surfel
  intersection (the centre's only in the low-pass fallback).  gsplat appends
  the surfel centre's z as a colour channel, so its "D", "ED", median depth
  and distortion all use the centre depth.
* Distortion.  splat: D = sum_i sum_{j<i} w_i w_j (m_i - m_j)^2 with
  m(z) = far / (far - near) (1 - near / z) in [0, 1) (2DGS's form; near and
  far are ``near_plane`` and ``far_plane``).  gsplat: 2 sum_i sum_{j<i}
  w_i w_j (z_i - z_j) on raw centre depths (Mip-NeRF 360's L1 form, in scene
  units; in "RGB" mode it runs on the blue channel).  The two penalties agree
  for a pixel whose weight is split between two samples dz apart at depth z
  when dist_lambda_splat = 2 dist_lambda_gsplat / (m'(z)^2 dz), with
  m'(z) = far / (far - near) near / z^2.  gsplat's example trainer (0.01,
  near 0.2, far 200) at z = 3, dz = 0.03 gives about 1350; splat's own
  default is 100.  ``distloss`` only checks that a depth mode is rendered, as
  in gsplat: the distortion is always returned.
* Near test.  Both cull a surfel whose centre is outside the clip range
  (gsplat keeps z == near_plane, splat needs near < z < far).  splat also
  skips each sample whose intersection depth is <= near_plane; gsplat has no
  per-sample test, so a tilted surfel crossing the near plane still draws
  the part behind it.
* Median depth.  Both take the last sample entered with T > 0.5; gsplat reads
  it from the last colour channel, which is the blue channel in "RGB" mode.
* Screen radii.  ``meta["radii"]`` is splat's exact opacity-aware radius (the
  half-extent of where o G >= 1/255, or of the low-pass disc), repeated in
  both columns; gsplat's is ceil(3.33 sqrt(.)) of the 1-sigma ellipse's
  bounding box per axis.  ``radius_clip`` compares splat's radius, and screen
  thresholds tuned on gsplat's radii act on other numbers.
* Surface normals.  splat's :func:`splat.losses.depth_to_normal` (central
  differences through pixel centres, zero on the border and where the depth
  is 0, flipped to face the camera); gsplat's is the same construction
  without the flip and the zero-depth mask.
* Skew.  splat uses K[0, 1]; gsplat drops it.

Gradients gsplat gets wrong, exact here:

* ``meta["gradient_2dgs"].grad``.  gsplat writes, per pixel thread,
  dL/dM[0, 2] M[2, 2] and dL/dM[1, 2] M[2, 2] (M = ``ray_transforms``), read
  from the dL/dM buffer while other threads are still adding to it, and
  overwrites rather than sums: the value depends on scheduling, keeps one of
  the three terms of dL/d(translation), and misses the low-pass samples.
  Here it is exactly dL/d(translating the footprint by one pixel),
  sum_k dL/dM[0, k] M[2, k] (and row 1 for y), over every sample including the
  low-pass ones.  Units are pixels, as gsplat's, so ``DefaultStrategy``'s
  scaling by (W / 2, H / 2) n_cameras and its ``grow_grad2d`` (0.0002) mean
  what they mean there.
* ``meta["means2d"].grad`` is that same translation gradient (gsplat's holds
  only the low-pass samples' share, through its bounding-box centre).  Its
  value is splat's projected centre.
* ``Ks`` gets gradients (gsplat: none, as its docstring warns).

Arguments splat cannot honour raise a ``ValueError`` naming them:
``absgrad=True`` (no AbsGS per-pixel absolute gradient), ``sparse_grad=True``
(gradients are dense), colours with other than 3 channels, per-camera SH
coefficients, leading batch dimensions, and ``backgrounds`` with a depth-only
``render_mode`` (gsplat adds T bg to its depth channel then).  ``eps2d`` has no effect, as in
gsplat's 2DGS projection, which never reads it; ``tile_size`` only sets the
tile counts in ``meta`` (splat bins in tiles of
:data:`splat.conventions.TILE_SIZE` whatever it is, with the same images).
``meta`` has no ``ray_transforms``, ``tiles_per_gauss``, ``isect_ids``,
``flatten_ids`` or ``isect_offsets``: reading one raises a ``KeyError``
that says so.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch

from .. import conventions as cv
from ..losses import depth_to_normal
from ..rasterize import _project, _resolve_backend, rasterize
from ..rasterize_3dgs import gaussian_kernel_inputs, projects_fused, rasterize_3dgs_and_inputs
from ..reference import facing_normals

RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
DEPTH_MODES = ("expected", "median")
#: gsplat meta keys that splat does not produce (gsplat's tile-binning internals).
MISSING_META = ("ray_transforms", "tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets")


class _Meta(dict):
    """gsplat's ``meta``; a key of gsplat's that splat lacks raises a KeyError naming it."""

    def __missing__(self, key):
        if key in MISSING_META:
            raise KeyError(f"meta[{key!r}]: splat does not expose gsplat's tile-binning internals")
        raise KeyError(key)


def rasterization_2dgs(
    means: torch.Tensor,
    quats: torch.Tensor,
    scales: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: Optional[int] = None,
    packed: bool = False,
    tile_size: int = 16,
    backgrounds: Optional[torch.Tensor] = None,
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    distloss: bool = False,
    depth_mode: str = "expected",
) -> tuple:
    """Renders N surfels into C cameras with gsplat 1.5's interface and splat's maths.

    Args:
        means: [N, 3] world positions.
        quats: [N, 4] rotations (w, x, y, z), normalised here.
        scales: [N, 3] linear standard deviations; the third (gsplat's normal
            axis) is unused and gets a zero gradient.  [N, 2] is accepted too.
        opacities: [N] in [0, 1].
        colors: [N, 3] or [C, N, 3] colours, or with ``sh_degree`` SH
            coefficients [N, K >= (sh_degree + 1)^2, 3]; colour =
            max(SH(dir) + 0.5, 0), dir from the camera centre to the mean.
        viewmats: [C, 4, 4] world -> camera, OpenCV axes.
        Ks: [C, 3, 3] intrinsics in pixels; pixel (i, j) has its centre at
            (j + 0.5, i + 0.5).
        width, height: image size in pixels.
        near_plane, far_plane: the clip range; also splat's near and far,
            so they set the distortion's m(z) (module docstring).
        radius_clip: surfels whose screen radius (splat's, in pixels) is
            <= this are not drawn in that camera.
        eps2d: no effect (gsplat's 2DGS projection does not read it either).
        sh_degree: None for colours, else the SH degree (0..3) to evaluate.
        packed: meta tensors as [nnz, ...] over the (camera, surfel) pairs
            with radii > 0, camera-major, with ``camera_ids`` and
            ``gaussian_ids``; else [C, N, ...].
        tile_size: only sets ``meta``'s tile counts.
        backgrounds: [C, 3] colour behind the surfels, or None (black).
        render_mode: "RGB", "D", "ED", "RGB+D" or "RGB+ED".
        sparse_grad, absgrad: must be False.
        distloss: True requires a depth ``render_mode`` (as gsplat).
        depth_mode: "expected" (the rendered "D" or "ED" channel) or "median":
            the depth ``surf_normals`` are computed from.

    Returns:
        (render_colors, render_alphas, render_normals, surf_normals,
        render_distort, render_median, meta), laid out as the module
        docstring shows.  ``meta["gradient_2dgs"]`` [C, N, 2] (zeros) and
        ``meta["means2d"]`` [C, N, 2] (projected centres) are leaves whose
        ``.grad`` after ``backward()`` is dL/d(screen translation) in pixels.
    """
    _check_arguments(
        means,
        scales,
        colors,
        viewmats,
        Ks,
        width,
        height,
        near_plane,
        far_plane,
        radius_clip,
        eps2d,
        sh_degree,
        packed,
        tile_size,
        backgrounds,
        render_mode,
        sparse_grad,
        absgrad,
        distloss,
        depth_mode,
    )
    n_cameras = viewmats.shape[0]
    per_camera_colors = sh_degree is None and colors.dim() == 3
    outs = []
    for c in range(n_cameras):
        viewmat, K = viewmats[c], Ks[c]
        camera_opacities = opacities
        if radius_clip > 0:
            camera_opacities = _clip_by_radius(
                means, quats, scales, opacities, viewmat, K, width, height, near_plane, far_plane, radius_clip
            )
        outs.append(
            rasterize(
                means,
                quats,
                scales[:, :2],
                camera_opacities,
                colors[c] if per_camera_colors else colors,
                viewmat,
                K,
                width,
                height,
                near=near_plane,
                far=far_plane,
                background=None if backgrounds is None else backgrounds[c],
                sh_degree=sh_degree,
            )
        )

    alphas = torch.stack([o.alpha for o in outs])[..., None]  # [C, H, W, 1]
    render_colors = _render_colors(outs, render_mode)  # [C, H, W, X]
    surf_normals = None
    if render_mode in ("RGB+D", "RGB+ED"):
        depth = render_colors[..., -1] if depth_mode == "expected" else torch.stack([o.median_depth for o in outs])
        surf_normals = _surface_normals(depth, Ks, viewmats)
    meta = _meta(outs, means, quats, opacities, viewmats, width, height, tile_size, packed)
    return (
        render_colors,
        alphas,
        torch.stack([o.normal for o in outs]),
        surf_normals,
        meta["render_distort"],
        torch.stack([o.median_depth for o in outs])[..., None],
        meta,
    )


def rasterization(
    means: torch.Tensor,
    quats: torch.Tensor,
    scales: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: Optional[int] = None,
    packed: bool = True,
    tile_size: int = 16,
    backgrounds: Optional[torch.Tensor] = None,
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: str = "pinhole",
    covars: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """Renders N 3D Gaussians into C cameras with gsplat 1.5's ``rasterization`` interface
    and splat's maths (:func:`splat.rasterize_3dgs` per camera).

    Arguments as gsplat's; ``rasterize_mode="antialiased"`` is Mip-Splatting's
    opacity compensation, ``eps2d`` must be splat's screen-space dilation
    (0.3 px^2, :data:`splat.conventions.EWA_DILATION`), ``channel_chunk`` has
    no effect (3 channels), and ``distributed=True``, camera models other
    than "pinhole", ``covars``, ``absgrad`` and ``sparse_grad`` raise a
    ``ValueError`` naming them.

    Where splat differs from gsplat's 3DGS kernels (v1.5.0):

    * Depth.  "D" is sum_i w_i z_i and "ED" that over 1 - T, as gsplat, but
      z_i is where Gaussian i's density peaks along the pixel's ray
      (GOF, RaDe-GS), not the camera z of its centre.
    * Alpha clamp 0.99 (gsplat 0.999), as for ``rasterization_2dgs``.
    * ``meta["radii"]`` is splat's exact opacity-aware half-extent per axis
      (where o exp(-rho / 2) >= 1/255), not gsplat's 3-sigma box.
    * Skew K[0, 1] is used; ``Ks`` get gradients.

    ``meta`` holds gsplat's keys (``means2d``, whose ``.grad`` is dL/d(screen
    translation) in pixels for ``DefaultStrategy``; ``radii``, ``depths``,
    ``conics``, ``opacities``, ``camera_ids`` / ``gaussian_ids`` when
    packed, ``width``, ``height``, ``n_cameras``, tile counts) plus what only
    splat renders: ``render_normals`` [C, H, W, 3] (world, sum w n),
    ``render_distort`` [C, H, W, 1] (the distortion, ``rasterization_2dgs``'s
    definition) and ``render_median`` [C, H, W, 1].

    Returns:
        (render_colors [C, H, W, X], render_alphas [C, H, W, 1], meta).
    """
    if rasterize_mode not in ("classic", "antialiased"):
        raise ValueError(f"rasterize_mode must be 'classic' or 'antialiased', got {rasterize_mode!r}")
    if distributed:
        raise ValueError("distributed=True: splat's gsplat shim renders in one process")
    if camera_model != "pinhole":
        raise ValueError(f"camera_model={camera_model!r}: splat renders pinhole cameras (undistort the images)")
    if covars is not None:
        raise ValueError("covars: splat takes quats and scales, not covariances; pass covars=None")
    if not isinstance(eps2d, (int, float)) or abs(eps2d - cv.EWA_DILATION) > 1e-12:
        raise ValueError(f"eps2d={eps2d!r}: splat's screen-space dilation is fixed at {cv.EWA_DILATION} px^2")
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[1] != 3:
        raise ValueError(f"scales must be [N, 3], got {_shape(scales)}")
    _check_arguments(
        means,
        scales,
        colors,
        viewmats,
        Ks,
        width,
        height,
        near_plane,
        far_plane,
        radius_clip,
        eps2d,
        sh_degree,
        packed,
        tile_size,
        backgrounds,
        render_mode,
        sparse_grad,
        absgrad,
        False,
        "expected",
    )
    antialiased = rasterize_mode == "antialiased"
    per_camera_colors = sh_degree is None and colors.dim() == 3
    outs, conics, opacities_used = [], [], []
    for c in range(viewmats.shape[0]):
        viewmat, K = viewmats[c], Ks[c]
        camera_opacities, kin = opacities, None
        if radius_clip > 0:
            # The radii decide which Gaussians draw at all: a projection before
            # the render (its conics and opacities, unclipped, are meta's),
            # by the render's own path, so that they are the render's bits
            # (the PyTorch projection's products round differently from the
            # kernels' on CPUs where BLAS fuses multiply-adds).
            fused = projects_fused(_resolve_backend("auto", means.device))
            with torch.no_grad():
                kin = gaussian_kernel_inputs(
                    means.detach(),
                    quats.detach(),
                    scales.detach(),
                    opacities.detach(),
                    viewmat.detach(),
                    K.detach(),
                    width,
                    height,
                    near_plane,
                    far_plane,
                    antialiased,
                    fused=fused,
                )
            radii = torch.zeros(means.shape[0], dtype=torch.int32, device=means.device)
            radii[kin["ids"]] = kin["radii"]
            camera_opacities = torch.where(radii > radius_clip, opacities, torch.zeros_like(opacities))
        out, rendered_from = rasterize_3dgs_and_inputs(
            means,
            quats,
            scales,
            camera_opacities,
            colors[c] if per_camera_colors else colors,
            viewmat,
            K,
            width,
            height,
            near=near_plane,
            far=far_plane,
            background=None if backgrounds is None else backgrounds[c],
            sh_degree=sh_degree,
            antialiased=antialiased,
        )
        outs.append(out)
        if kin is None:
            kin = rendered_from
        conic = means.new_zeros(means.shape[0], 3)
        conic[kin["ids"]] = kin["params"].detach()[:, 0:3]  # core.h kGaussConic: C_xx, C_xy, C_yy
        used = means.new_zeros(means.shape[0])
        used[kin["ids"]] = kin["params"].detach()[:, 5]  # the (compensated) opacity
        conics.append(conic)
        opacities_used.append(used)
    render_colors = _render_colors(outs, render_mode)
    alphas = torch.stack([o.alpha for o in outs])[..., None]
    meta = _meta(outs, means, None, opacities, viewmats, width, height, tile_size, packed)
    extra = {"conics": torch.stack(conics), "opacities": torch.stack(opacities_used)}
    if packed:
        extra = {k: v[meta["camera_ids"], meta["gaussian_ids"]] for k, v in extra.items()}
    meta.update(extra)
    for key in ("normals", "gradient_2dgs"):  # rasterization_2dgs's, not gsplat's 3DGS meta
        del meta[key]
    meta["render_normals"] = torch.stack([o.normal for o in outs])
    meta["render_median"] = torch.stack([o.median_depth for o in outs])[..., None]
    return render_colors, alphas, meta


def _check_arguments(
    means,
    scales,
    colors,
    viewmats,
    Ks,
    width,
    height,
    near_plane,
    far_plane,
    radius_clip,
    eps2d,
    sh_degree,
    packed,
    tile_size,
    backgrounds,
    render_mode,
    sparse_grad,
    absgrad,
    distloss,
    depth_mode,
):
    """One-line errors naming gsplat's argument, for what splat.rasterize does not check itself."""
    if absgrad:
        raise ValueError(
            "absgrad=True: splat computes no absolute (AbsGS) per-pixel 2D-mean gradient; "
            "use absgrad=False and DefaultStrategy(absgrad=False)"
        )
    if sparse_grad:
        raise ValueError("sparse_grad=True: splat returns dense gradients; use sparse_grad=False")
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    if depth_mode not in DEPTH_MODES:
        raise ValueError(f"depth_mode must be one of {DEPTH_MODES}, got {depth_mode!r}")
    if distloss and render_mode == "RGB":
        raise ValueError("distloss=True needs a depth render_mode ('D', 'ED', 'RGB+D' or 'RGB+ED'), got 'RGB'")
    for name, value in (("packed", packed), ("distloss", distloss)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size <= 0:
        raise ValueError(f"tile_size must be a positive int, got {tile_size!r}")
    for name, value in (("radius_clip", radius_clip), ("eps2d", eps2d)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not (
        isinstance(near_plane, (int, float))
        and isinstance(far_plane, (int, float))
        and 0 < near_plane < far_plane < math.inf
    ):
        raise ValueError(
            f"need 0 < near_plane < far_plane < inf, got near_plane={near_plane!r}, far_plane={far_plane!r}"
        )
    if not isinstance(means, torch.Tensor) or means.dim() != 2:
        got = list(means.shape) if isinstance(means, torch.Tensor) else type(means).__name__
        raise ValueError(
            f"means must be [N, 3] (gsplat 1.5.0's layout; leading batch dimensions are not supported), got {got}"
        )
    n = means.shape[0]
    if (
        not isinstance(viewmats, torch.Tensor)
        or viewmats.dim() != 3
        or viewmats.shape[1:] != (4, 4)
        or viewmats.shape[0] == 0
    ):
        raise ValueError(f"viewmats must be [C, 4, 4] with C >= 1, got {_shape(viewmats)}")
    n_cameras = viewmats.shape[0]
    if not isinstance(Ks, torch.Tensor) or Ks.shape != (n_cameras, 3, 3):
        raise ValueError(f"Ks must be [C, 3, 3] with C = {n_cameras} (viewmats), got {_shape(Ks)}")
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[1] not in (2, 3):
        raise ValueError(f"scales must be [N, 3] (or [N, 2]), got {_shape(scales)}")
    if not isinstance(colors, torch.Tensor):
        raise ValueError(f"colors must be a tensor, got {type(colors).__name__}")
    if sh_degree is None:
        if colors.shape[-1] != 3 or colors.shape[:-1] not in ((n,), (n_cameras, n)):
            raise ValueError(f"colors must be [N, 3] or [C, N, 3] (splat renders 3 channels), got {list(colors.shape)}")
    elif colors.dim() != 3:
        raise ValueError(
            f"colors with sh_degree must be [N, K, 3] (per-camera SH coefficients are not "
            f"supported), got {list(colors.shape)}"
        )
    if backgrounds is not None and (not isinstance(backgrounds, torch.Tensor) or backgrounds.shape != (n_cameras, 3)):
        raise ValueError(f"backgrounds must be [C, 3] with C = {n_cameras}, got {_shape(backgrounds)}")
    if backgrounds is not None and not render_mode.startswith("RGB"):
        # gsplat would add T * background to its depth channel; splat puts nothing behind depth.
        raise ValueError(
            f"backgrounds with render_mode={render_mode!r}: splat composites no background "
            "behind depth; pass backgrounds=None"
        )


def _shape(t):
    return list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _clip_by_radius(means, quats, scales, opacities, viewmat, K, width, height, near, far, radius_clip):
    """opacities [N] with 0 where splat's screen radius in this camera is <= radius_clip.

    A zero opacity is below the 1/255 alpha cut everywhere, so the surfel draws
    nothing and gets zero gradients there, as a surfel gsplat culls does."""
    with torch.no_grad():
        radii = _project(means, quats, scales[:, :2], opacities, viewmat, K, width, height, near, far)["radii"]
    return torch.where(radii > radius_clip, opacities, torch.zeros_like(opacities))


def _render_colors(outs, render_mode):
    """gsplat's render_colors [C, H, W, X] for render_mode from splat's outputs."""
    channels = []
    if render_mode.startswith("RGB"):
        channels.append(torch.stack([o.rgb for o in outs]))  # [C, H, W, 3]
    if render_mode.endswith("ED"):
        channels.append(torch.stack([o.depth for o in outs])[..., None])  # sum w z / (1 - T)
    elif render_mode.endswith("D"):
        channels.append(torch.stack([_accumulated_depth(o) for o in outs])[..., None])
    return torch.cat(channels, dim=-1)


def _accumulated_depth(out):
    """[H, W] sum_i w_i z_i: splat's expected depth times alpha (both 0 where alpha is 0)."""
    return out.depth * out.alpha


def _surface_normals(depth, Ks, viewmats):
    """gsplat's surf_normals: [C, H, W, 3] world-frame normals of depth [C, H, W], squeezed at
    dim 0 as gsplat does (so [H, W, 3] for one camera)."""
    normals = torch.stack([depth_to_normal(d, K, v) for d, K, v in zip(depth, Ks, viewmats)])
    return normals.squeeze(0)


def _gsplat_radii(radii):
    """splat's radius [N] as gsplat's per-axis radii [N, 2] (the same bound on both axes)."""
    return torch.stack([radii, radii], dim=-1)


def _camera_normals(means, quats, viewmat):
    """gsplat's meta normals [N, 3]: camera-frame unit normals, flipped to face the camera."""
    return facing_normals(quats, means, viewmat) @ viewmat[:3, :3].T


def _camera_depths(means, viewmat):
    """[N] camera z of the surfel centres (gsplat's meta depths)."""
    return means @ viewmat[2, :3] + viewmat[2, 3]


def _meta(outs, means, quats, opacities, viewmats, width, height, tile_size, packed):
    """gsplat's meta dict; see rasterization_2dgs."""
    n_cameras, n = len(outs), means.shape[0]
    radii = torch.stack([_gsplat_radii(o.radii) for o in outs])  # [C, N, 2]
    centres = torch.stack([o.means2d.detach() for o in outs])  # [C, N, 2]
    depths = torch.stack([_camera_depths(means, v) for v in viewmats])  # [C, N]
    normals = (
        torch.stack([_camera_normals(means, quats, v) for v in viewmats])
        if quats is not None  # [C, N, 3]
        else means.new_zeros(n_cameras, n, 3)
    )
    camera_opacities = opacities.expand(n_cameras, n)  # [C, N]
    camera_ids = gaussian_ids = None
    if packed:
        camera_ids, gaussian_ids = (radii > 0).all(-1).nonzero(as_tuple=True)  # [nnz] each, camera-major
        radii, centres, depths, normals, camera_opacities = (
            t[camera_ids, gaussian_ids] for t in (radii, centres, depths, normals, camera_opacities)
        )
    means2d = centres.clone().requires_grad_(True)
    gradient_2dgs = torch.zeros_like(centres).requires_grad_(True)
    for c, out in enumerate(outs):
        if out.means2d.requires_grad:
            # The translation gradient arrives on splat's per-camera means2d
            # leaf; a hook copies it into gsplat's [C, N, 2] (or [nnz, 2]) leaves.
            rows = (camera_ids == c).nonzero().flatten() if packed else None
            cols = gaussian_ids[rows] if packed else None
            out.means2d.register_hook(functools.partial(_add_grad, (means2d, gradient_2dgs), c, rows, cols))
    tile_width, tile_height = math.ceil(width / tile_size), math.ceil(height / tile_size)
    return _Meta(
        camera_ids=camera_ids,
        gaussian_ids=gaussian_ids,
        radii=radii,
        means2d=means2d,
        depths=depths,
        opacities=camera_opacities,
        normals=normals,
        tile_width=tile_width,
        tile_height=tile_height,
        width=width,
        height=height,
        tile_size=tile_size,
        n_cameras=n_cameras,
        render_distort=torch.stack([o.distortion for o in outs])[..., None],
        gradient_2dgs=gradient_2dgs,
    )


def _add_grad(sinks, camera, rows, cols, grad):
    """Backward hook: adds camera's dL/d(means2d) [N, 2] into each sink's .grad, at
    [camera] ([C, N, 2] sinks) or at rows from surfels cols ([nnz, 2] sinks)."""
    with torch.no_grad():
        for sink in sinks:
            if sink.grad is None:
                sink.grad = torch.zeros_like(sink)
            if rows is None:
                sink.grad[camera] += grad
            else:
                sink.grad[rows] += grad[cols]
    return None
