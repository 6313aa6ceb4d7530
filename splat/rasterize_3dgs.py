"""``splat.rasterize_3dgs``: 3D Gaussians through the surfels' tile pipeline.

The same binning, depth sort, front-to-back blending, back-to-front walk
with ``last_dL_dT``, outputs (rgb, alpha, expected and median depth,
normals, the distortion from the A, D, D^2 sums) and public output type as
:func:`splat.rasterize`; only the per-pixel evaluation differs.  The maths
is in :mod:`splat.reference_3dgs` (the oracle) and, per pixel, in
``core.h`` ("3D Gaussians").

Why a sibling function and not ``rasterize(..., primitive="3dgs")``: the two
take different inputs (three scales instead of two, and the ``antialiased``
option only means something for EWA splatting), so one signature would
have to say "scales is [N, 2] or [N, 3] depending on another argument".
gsplat makes the same split (``rasterization`` / ``rasterization_2dgs``).

Projection (EWA, the antialiasing compensation, and the per-Gaussian terms
of the peak depth and normal) is differentiated with respect to means, quats,
scales, opacities, viewmat and K.  On the CPU backend it is one fused C++ op
with an exact backward (kernels/project_gaussians.h,
cpu/project_gaussians_cpu.cpp), as the surfels' projection is, and so on the
CUDA backend (the same maths, one thread per Gaussian, cuda/project.cu);
elsewhere, and as its reference, plain PyTorch (:func:`gaussian_kernel_inputs` with ``fused=False``).  The compiled
raster kernel does the per-pixel work and its exact backward.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _backend, conventions as cv
from ._backend import load_extension
from .outputs import RasterOutput, compose
from .rasterize import (
    _connect,
    _empty_sums,
    _resolve_backend as resolve_backend,
    _surfel_colors,
    _validate,
    depth_in_range,
    raster_backward,
    raster_forward,
    saved_inputs,
)
from .reference_3dgs import project_gaussians, rasterize_reference_3dgs

__all__ = ["rasterize_3dgs", "gaussian_kernel_inputs", "projects_fused"]

#: (row, column) of the six stored entries of the symmetric Q (core.h kGaussPeakDen).
_SYM3 = ([0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2])


def rasterize_3dgs(
    means: torch.Tensor,
    quats: torch.Tensor,
    scales: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    near: float = 0.2,
    far: float = 100.0,
    background: Optional[torch.Tensor] = None,
    sh_degree: Optional[int] = None,
    backend: str = "auto",
    antialiased: bool = False,
) -> RasterOutput:
    """Renders N 3D Gaussians into a W x H image.

    Args:
        means: [N, 3] world positions.
        quats: [N, 4] rotations (w, x, y, z); normalised here.
        scales: [N, 3] standard deviations along the rotation's axes, > 0
            (the depth and normal need the precision matrix Sigma^-1).
        opacities: [N] in [0, 1].
        colors: [N, 3] RGB, or SH coefficients [N, K, 3] with ``sh_degree``
            (as :func:`splat.rasterize`).
        viewmat, K, width, height, near, far, background: as
            :func:`splat.rasterize` (one camera and pixel convention,
            :mod:`splat.conventions`).
        backend: "cuda", "cpu" (C++/OpenMP), "torch"
            (:mod:`splat.reference_3dgs`) or "auto", chosen as by
            :func:`splat.rasterize`.
        antialiased: Mip-Splatting's opacity compensation (gsplat's
            ``rasterize_mode="antialiased"``).

    Per Gaussian: EWA projection with the 0.3 px^2 screen-space dilation
    (``conventions.EWA_DILATION``); per pixel p, with delta = p - centre,
    alpha = min(0.99, o exp(-delta^T S^-1 delta / 2)).  A sample's depth is
    where the Gaussian's density peaks along the pixel's ray,
    z = d^T P mu / d^T P d (d = K^-1 (p, 1), camera space, P = Sigma^-1),
    and its normal is that of the surface the peaks sweep,
    n = W^T P (mu - 2 z d) normalised.  Blending, depth, median and
    distortion are the surfels' (:func:`splat.rasterize`).

    Returns:
        :class:`RasterOutput`; gradients flow from any output to every input.
        ``means2d`` [N, 2] holds the projected centres, and its gradient is
        dL/d(translating the footprint by one pixel), as for surfels.
    """
    return rasterize_3dgs_and_inputs(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmat,
        K,
        width,
        height,
        near,
        far,
        background,
        sh_degree,
        backend,
        antialiased,
    )[0]


def rasterize_3dgs_and_inputs(
    means: torch.Tensor,
    quats: torch.Tensor,
    scales: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    near: float = 0.2,
    far: float = 100.0,
    background: Optional[torch.Tensor] = None,
    sh_degree: Optional[int] = None,
    backend: str = "auto",
    antialiased: bool = False,
) -> Tuple[RasterOutput, dict]:
    """:func:`rasterize_3dgs`, and the :func:`gaussian_kernel_inputs` it
    rendered from (the drop-ins read conics and radii there instead of
    projecting again)."""
    _validate(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmat,
        K,
        width,
        height,
        near,
        far,
        background,
        sh_degree,
        backend,
        num_scales=3,
        positive_scales=True,
    )
    backend = resolve_backend(backend, means.device)
    n, dtype, device = means.shape[0], means.dtype, means.device
    inputs = (means, quats, scales, opacities, colors, viewmat, K, background)
    grad_enabled = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    means2d = torch.zeros(n, 2, dtype=dtype, device=device)
    radii = torch.zeros(n, dtype=torch.int32, device=device)
    # The fused projection takes means2d (its value is not read) and returns
    # its gradient itself; the PyTorch one gets it from _shift_footprints below.
    fused = projects_fused(backend)
    means2d.requires_grad_(grad_enabled)
    with torch.set_grad_enabled(torch.is_grad_enabled() and backend != "torch"):  # the reference projects itself
        kin = gaussian_kernel_inputs(
            means,
            quats,
            scales,
            opacities,
            viewmat,
            K,
            width,
            height,
            near,
            far,
            antialiased,
            fused=fused,
            means2d=means2d if fused and grad_enabled else None,
        )
    if n == 0:
        sums = _connect(_empty_sums(width, height, dtype, device), inputs + (means2d,))
        return compose(*sums, background=background, radii=radii, means2d=means2d), kin

    rgb_colors = _surfel_colors(means, colors, viewmat, sh_degree)
    ids = kin["ids"]
    # Nothing culled (the usual case): ids is 0..N-1, so the gathers and
    # scatters by ids below are identities, skipped (same values and gradients).
    all_kept = ids.shape[0] == n
    with torch.no_grad():
        if all_kept:
            means2d.copy_(kin["centre"])
            radii.copy_(kin["radii"])
        else:
            means2d[ids] = kin["centre"].detach()
            radii[ids] = kin["radii"]
    if backend == "torch":
        sums = rasterize_reference_3dgs(
            means,
            quats,
            scales,
            opacities,
            rgb_colors,
            viewmat,
            K,
            width,
            height,
            near,
            far,
            means2d=means2d if grad_enabled else None,
            antialiased=antialiased,
        )
    else:
        params = kin["params"]
        if grad_enabled and not fused:
            params = _shift_footprints(params, means2d[ids] - means2d[ids].detach())
        sums = _RasterizeGaussians.apply(
            params,
            rgb_colors if all_kept else rgb_colors[ids],
            kin["depth"],
            kin["pixel_rect"],
            width,
            height,
            near,
            far,
        )
    if grad_enabled:
        sums = _connect(sums, inputs + (means2d,))
    return compose(*sums, background=background, radii=radii, means2d=means2d), kin


def projects_fused(backend: str) -> bool:
    """Whether a render on ``backend`` (resolved: ``cpu``, ``cuda`` or
    ``torch``) projects its Gaussians by the fused C++ / CUDA op, whose bits
    are the kernels'; else by the PyTorch reference."""
    return backend in ("cpu", "cuda")


def gaussian_kernel_inputs(
    means: torch.Tensor,
    quats: torch.Tensor,
    scales: torch.Tensor,
    opacities: torch.Tensor,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    near: float,
    far: float,
    antialiased: bool = False,
    fused: bool = False,
    means2d: Optional[torch.Tensor] = None,
) -> dict:
    """The per-Gaussian rows the kernels read (core.h "3D Gaussians"), for the
    Gaussians that are not culled.

    ``fused``: computed by the C++ op (CPU tensors; the same maths, values
    equal up to float rounding, tests/test_project_gaussians.py), or its CUDA
    twin on CUDA tensors (bitwise the CPU's under emulation:
    tests/test_cuda_emulation_project_3dgs.py), instead of
    the PyTorch expressions below, which stay the reference.  ``means2d``
    [N, 2] (fused only; value not read): params' centre moves with it, so
    that its gradient is dL/d(translating the footprint by one pixel).

    Returns a dict: ``ids`` [M] (the Gaussians kept: centre depth in
    (near, far) and opacity >= ALPHA_MIN, in index order), ``params``
    [M, 27] (with autograd), ``centre`` [M, 2] px, ``depth`` [M] (the sort
    key, camera z of the mean), ``pixel_rect`` [M, 4] int32 and ``radii`` [M].
    Culled Gaussians are left out *before* the projection divides by their
    depth, so they receive exactly zero gradient, never 0 * inf.
    """
    if fused:  # culls as below, in C++ or CUDA
        return _project_gaussians_fused(
            means, quats, scales, opacities, means2d, viewmat, K, width, height, near, far, antialiased
        )
    m, v = means.detach(), viewmat.detach()
    depth_all = (m[:, 0] * v[2, 0] + m[:, 1] * v[2, 1] + m[:, 2] * v[2, 2]) + v[2, 3]  # as mu's z (reference_3dgs)
    keep = depth_in_range(depth_all, near, far) & (opacities.detach().double() >= cv.ALPHA_MIN)
    ids = keep.nonzero().flatten()
    mu, precision, centre, conic, factor = project_gaussians(
        means[ids], quats[ids], scales[ids], viewmat, K, width, height, antialiased
    )
    opacity = opacities[ids] * factor  # [M]
    # The ray of pixel p = centre + delta is A (delta, 1) with
    # A = K^-1 [[1, 0, cx], [0, 1, cy], [0, 0, 1]]: columns K^-1 e_x, K^-1 e_y, K^-1 (centre, 1).
    m = centre.shape[0]
    K_inv = torch.linalg.inv(K)
    centre_ray = centre[:, :1] * K_inv[:, 0] + centre[:, 1:] * K_inv[:, 1] + K_inv[:, 2]  # [M, 3]
    A = torch.stack([K_inv[:, 0].expand(m, 3), K_inv[:, 1].expand(m, 3), centre_ray], 2)  # [M, 3, 3]
    PA = precision @ A
    Pmu = (precision @ mu[:, :, None])[:, :, 0]  # [M, 3]
    W = viewmat[:3, :3]
    peak_num = (A.transpose(1, 2) @ Pmu[:, :, None])[:, :, 0]  # A^T P mu
    peak_den = (A.transpose(1, 2) @ PA)[:, _SYM3[0], _SYM3[1]]  # A^T P A, upper triangle
    normal_slope = (W.T @ PA).reshape(m, 9)  # W^T P A
    normal_base = Pmu @ W  # W^T P mu, row by row
    conic3 = torch.stack([conic[:, 0, 0], conic[:, 0, 1], conic[:, 1, 1]], 1)
    params = torch.cat([conic3, centre, opacity[:, None], peak_num, peak_den, normal_slope, normal_base], 1)
    if not bool(torch.isfinite(params.detach()).all()):
        _raise_not_finite(params, ids, means.dtype)
    with torch.no_grad():
        rect, radii = _screen_bounds(conic3, centre, opacity, width, height)
    return {
        "ids": ids,
        "params": params,
        "centre": centre,
        "depth": mu[:, 2].detach().contiguous(),
        "pixel_rect": rect,
        "radii": radii,
    }


def _raise_not_finite(params, ids, dtype):
    bad = ids[~torch.isfinite(params.detach()).all(1)][:5].tolist()
    raise ValueError(
        f"Gaussians at rows {bad} are too thin or too large for {dtype}: their inverse "
        f"covariance overflows (scales, or the scene's scale); rescale the scene or use float64"
    )


def _project_gaussians_fused(
    means, quats, scales, opacities, means2d, viewmat, K, width, height, near, far, antialiased
):
    """gaussian_kernel_inputs' culling and projection as one C++ or CUDA op
    (_ProjectGaussians).  K^-1 is torch's, so that its gradient (through
    torch.linalg.inv) is the reference's; the op returns dL/dK^-1 and the rest
    of dL/dK itself."""
    K_inv = torch.linalg.inv(K)
    ids, params, centre, depth, rect, radii, bad = _ProjectGaussians.apply(
        means, quats, scales, opacities, means2d, viewmat, K, K_inv, width, height, near, far, antialiased
    )
    if int(bad):  # on CUDA a wait for the projection kernel (the cull has synced once already)
        _raise_not_finite(params, ids, means.dtype)
    return {"ids": ids, "params": params, "centre": centre, "depth": depth, "pixel_rect": rect, "radii": radii}


class _ProjectGaussians(torch.autograd.Function):
    """splat's project_gaussians_forward_cpu / _backward_cpu, or their *_cuda
    twins on CUDA tensors: returns (ids [M],
    params [M, 27], centre [M, 2], depth [M], pixel_rect, radii, non-finite
    row count) for the Gaussians kept (``ids``); gradients flow from params and centre to means,
    quats, scales, opacities, viewmat, K and K^-1, and from params' centre to
    ``means2d`` (None, or [N, 2] whose value is not read: a screen translation)."""

    @staticmethod
    def forward(
        ctx, means, quats, scales, opacities, means2d, viewmat, K, K_inv, width, height, near, far, antialiased
    ):
        ext = _backend.load_extension()  # not this module's name, which tests swap for the raster kernels
        args = [t.contiguous() for t in (means, quats, scales, opacities)]
        cam = [t.detach().contiguous() for t in (viewmat, K, K_inv)]
        project = ext.project_gaussians_forward_cuda if means.is_cuda else ext.project_gaussians_forward_cpu
        outs = project(*args, *cam, width, height, near, far, antialiased)
        ctx.save_for_backward(*args, outs[0], *cam)
        ctx.image = (width, height, antialiased)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(outs[0], *outs[3:])
        return tuple(outs)

    @staticmethod
    def backward(ctx, _ids, v_params, v_centre, *_):
        ext = _backend.load_extension()
        means, quats, scales, opacities, ids, viewmat, K, K_inv = ctx.saved_tensors
        if v_params is None and v_centre is None:
            return (None,) * 13
        if v_params is None:
            v_params = v_centre.new_zeros(ids.shape[0], ext.gauss_params_size)
        with_camera = any(ctx.needs_input_grad[5:8])
        project = ext.project_gaussians_backward_cuda if means.is_cuda else ext.project_gaussians_backward_cpu
        grads = project(
            means, quats, scales, opacities, ids, viewmat, K, K_inv, *ctx.image,
            _rows(v_params), None if v_centre is None else _rows(v_centre), with_camera,
        )  # fmt: skip
        v_means2d = grads[4] if ctx.needs_input_grad[4] else None
        camera = grads[5:] if with_camera else [None] * 3
        return (*grads[:4], v_means2d, *camera, None, None, None, None, None)


def _rows(g):
    """g, or a contiguous copy unless its rows are unit-stride (the op reads rows in place)."""
    return g if g.dim() == 2 and g.stride(1) == 1 and g.stride(0) >= g.shape[1] else g.contiguous()


def _shift_footprints(params, delta):
    """Moves each footprint by ``delta`` [M, 2] px (value 0: the gradient of
    means2d).  The centre moves, and the depth and normal terms stay
    expressed in delta = p - centre, so the whole sample moves with it."""
    c = 3  # core.h kGaussCenter
    return torch.cat([params[:, :c], params[:, c : c + 2] + delta, params[:, c + 2 :]], 1)


def _screen_bounds(conic3, centre, opacity, width, height):
    """Pixels each Gaussian may draw: int32 [M, 4] (x0, y0, x1, y1, exclusive), and radii [M].

    alpha >= 1/255 needs delta^T C delta <= k^2 = 2 ln(255 o); that ellipse's
    extent along x is k sqrt(S_xx) with S = C^-1 (and along y, k sqrt(S_yy)).
    Computed in float64 with a one-pixel margin, so rounding never drops a pixel."""
    c = conic3.double()
    o = opacity.double()
    k2 = 2.0 * torch.log(torch.clamp_min(o * 255.0, 1e-30))
    det = c[:, 0] * c[:, 2] - c[:, 1] * c[:, 1]
    visible = (o >= cv.ALPHA_MIN) & (k2 > 1e-12) & (det > 0)
    safe_det = torch.where(visible, det, torch.ones_like(det))
    half = torch.sqrt(torch.clamp_min(k2, 0.0)[:, None] * torch.stack([c[:, 2], c[:, 0]], 1) / safe_det[:, None])
    mid = centre.double()
    screen = torch.tensor([width, height], dtype=torch.float64, device=c.device)
    margin = 1.0
    first = torch.ceil(mid - half - 0.5 - margin).clamp(min=-1, max=max(width, height) + 1).long()
    last = torch.floor(mid + half - 0.5 + margin).clamp(min=-1, max=max(width, height) + 1).long() + 1
    first = torch.minimum(torch.clamp_min(first, 0), screen.long())
    last = torch.minimum(torch.clamp_min(last, 0), screen.long())
    visible &= (last > first).all(-1)
    rect = torch.where(visible[:, None], torch.cat([first, last], 1), torch.zeros_like(torch.cat([first, last], 1)))
    radii = torch.where(visible, torch.ceil(half.amax(-1)), torch.zeros_like(k2))
    return rect.to(torch.int32).contiguous(), cv.radii_int32(radii)


class _RasterizeGaussians(torch.autograd.Function):
    """Per-pixel rasterization of 3D Gaussians by splat._C.  Returns the raw sums of compose()."""

    @staticmethod
    def forward(ctx, params, color, depth, pixel_rect, width, height, near, far):
        ext = load_extension()
        kernel = ext.forward_gaussians_cuda if params.is_cuda else ext.forward_gaussians_cpu
        return raster_forward(ctx, kernel, (params, color, depth, pixel_rect), width, height, near, far)

    @staticmethod
    def backward(ctx, *v_sums):
        ext = load_extension()
        params = saved_inputs(ctx)[0]
        kernel = ext.backward_gaussians_cuda if params.is_cuda else ext.backward_gaussians_cpu
        v = raster_backward(ctx, kernel, v_sums)  # [M, 30]: core.h's Gaussian gradient record
        p = params.shape[1]
        v_params, v_color = v[:, :p], v[:, p:]
        return v_params, v_color, None, None, None, None, None, None
