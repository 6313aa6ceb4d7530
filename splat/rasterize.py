"""``splat.rasterize``: input validation, projection, backend dispatch, autograd.

The per-surfel projection (camera transform, screen matrix, bounds, SH
colour) is one fused kernel each way on the cpu and cuda backends when
viewmat and K need no gradient (kernels/project_surfels.h), else plain
PyTorch that autograd differentiates; the compiled kernels do the per-pixel
work (binning, blending, and its exact back-to-front gradient).  ``backend="torch"`` runs :mod:`splat.reference`.
"""

from __future__ import annotations

import array
import math
import warnings
from typing import NamedTuple, Optional

import torch

from . import _backend, conventions as cv
from ._backend import has_cuda_kernels, has_extension, load_extension
from .geometry import quat_to_rotmat
from .outputs import RasterOutput, compose
from .reference import camera_center, facing_normals, rasterize_reference
from .sh import eval_sh, num_sh_bases

BACKENDS = ("auto", "cuda", "cpu", "torch")
#: Largest image width or height: keeps pixel rectangles and tile counts within int32.
MAX_IMAGE_SIDE = 1 << 16


def rasterize(
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
) -> RasterOutput:
    """Renders N 2D Gaussian surfels into a W x H image.

    Args:
        means: [N, 3] world positions.
        quats: [N, 4] rotations (w, x, y, z); normalised here.
        scales: [N, 2] standard deviations along the tangent axes (the first two
            rotation columns; the third is the normal).  Must be >= 0; a zero
            scale makes a degenerate surfel that only the low-pass fallback draws.
        opacities: [N] in [0, 1].
        colors: [N, 3] RGB, or with ``sh_degree=d`` SH coefficients
            [N, K >= (d+1)^2, 3]; colour = max(SH(dir) + 0.5, 0) with dir the
            unit vector from the camera centre to the mean.
        viewmat: [4, 4] world -> camera, OpenCV (x right, y down, z forward).
        K: [3, 3] intrinsics in pixels, last row (0, 0, 1).  Pixel (i, j) has
            its centre at (j + 0.5, i + 0.5).
        width, height: image size in pixels.
        near, far: surfels whose centre lies outside (near, far) are culled,
            and a sample whose intersection depth is <= near is skipped.  The
            distortion uses m(z) = far / (far - near) (1 - near / z).
        background: [3] colour behind the surfels, or None (black, no gradient).
        backend: "cuda", "cpu" (C++/OpenMP), "torch" (the reference) or "auto"
            (the kernels for the tensors' device, else the reference).

    Per pixel, with surfels front to back, alpha_i = min(0.99, o_i G_i),
    T_i = prod_{j<i} (1 - alpha_j) and w_i = alpha_i T_i:
    rgb = sum w c + T bg, alpha = 1 - T, depth = sum w z / alpha,
    normal = sum w n, distortion = sum_i sum_{j<i} w_i w_j (m_i - m_j)^2.

    Returns:
        :class:`RasterOutput`; gradients flow from any output to every input.
    """
    _validate(
        means, quats, scales, opacities, colors, viewmat, K, width, height, near, far, background, sh_degree, backend
    )
    backend = _resolve_backend(backend, means.device)
    n = means.shape[0]
    dtype, device = means.dtype, means.device
    inputs = (means, quats, scales, opacities, colors, viewmat, K, background)
    grad_enabled = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    if n == 0:
        radii = torch.zeros(0, dtype=torch.int32, device=device)
        means2d = torch.zeros(0, 2, dtype=dtype, device=device, requires_grad=grad_enabled)
        sums = _empty_sums(width, height, dtype, device)
        return compose(*_connect(sums, inputs + (means2d,)), background=background, radii=radii, means2d=means2d)

    fused = backend in ("cpu", "cuda") and not (viewmat.requires_grad or K.requires_grad)
    proj, rgb_colors, means2d, Tuvw, center = project_for_kernels(
        means, quats, scales, opacities, colors, viewmat, K, width, height, near, far, sh_degree, grad_enabled, fused
    )

    if backend == "torch":
        sums = rasterize_reference(
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
        )
    else:
        sums = _RasterizeSurfels.apply(
            Tuvw,
            center,
            proj["normal"],
            rgb_colors,
            opacities,
            proj["depth"],
            proj["pixel_rect"],
            width,
            height,
            near,
            far,
        )
    if grad_enabled:
        sums = _connect(sums, inputs + (means2d,))
    return compose(*sums, background=background, radii=proj["radii"], means2d=means2d)


def project_for_kernels(
    means, quats, scales, opacities, colors, viewmat, K, width, height, near, far, sh_degree, grad_enabled, fused
):
    """What the raster kernels take, per surfel: returns (proj as
    :func:`_project`'s, colours [N, 3], means2d [N, 2], Tuvw [N, 9],
    centre [N, 2]).  ``fused``: the one C++/CUDA op (the cpu or cuda
    backend, no viewmat/K gradient), else PyTorch.  With ``grad_enabled``, ``means2d.grad``
    becomes dL/d(screen translation) either way (:func:`fold_translation`)."""
    if fused:
        proj, rgb, means2d = _project_fused(
            means, quats, scales, opacities, colors, viewmat, K, width, height, near, far, sh_degree, grad_enabled
        )
    else:
        rgb = _surfel_colors(means, colors, viewmat, sh_degree)
        proj = _project(means, quats, scales, opacities, viewmat, K, width, height, near, far)
        means2d = proj["center"].detach().clone()
    Tuvw, center = proj["Tuvw"], proj["center"]
    if grad_enabled and not proj["fused"]:
        means2d.requires_grad_(True)
        Tuvw, center = fold_translation(Tuvw, center, means2d)
    return proj, rgb, means2d, Tuvw, center


def fold_translation(Tuvw, center, means2d):
    """Folds a screen translation of each footprint into the kernel inputs
    (Tuvw [N, 9], center [N, 2]): the translation is ``means2d -
    means2d.detach()`` [N, 2], value 0 and gradient identity, so the result
    equals the inputs and ``means2d.grad`` becomes exactly dL/d(translating
    the footprint), the screen-space gradient densification reads.  A
    translation (dx, dy) moves rows Tu += dx Tw, Tv += dy Tw and the centre."""
    delta = means2d - means2d.detach()  # [N, 2]
    Tu, Tv, Tw = Tuvw[:, 0:3], Tuvw[:, 3:6], Tuvw[:, 6:9]
    return torch.cat([Tu + delta[:, :1] * Tw, Tv + delta[:, 1:] * Tw, Tw], dim=1), center + delta


def _connect(sums, inputs):
    """Attaches outputs that no surfel reached (N = 0, every surfel culled) to
    the graph with an exact zero, so that backward() gives every input a zero
    gradient instead of torch's "does not require grad" error."""
    if not torch.is_grad_enabled() or all(s.requires_grad for s in sums):
        return sums
    # t * 0 is exactly 0 for the finite (validated) inputs; means2d is finite too.
    zero = sum((t * 0).sum() for t in inputs if t is not None and t.requires_grad)
    return tuple(s if s.requires_grad else s + zero for s in sums)


# ---------------------------------------------------------------------------
# Projection and screen bounds (per surfel, plain PyTorch)
# ---------------------------------------------------------------------------
def _project(means, quats, scales, opacities, viewmat, K, width, height, near, far):
    """Screen matrix M = K [a b c] (rows Tu, Tv, Tw), centre, normal, bounds.

    A surfel whose centre is not in (near, far) is culled, and its columns
    [a b c] are replaced by zeros *before* M and the division by c_z: masking
    only the outputs would still send 0 * inf = NaN gradients into means,
    viewmat and K (the "double where" trap).  Its centre (means2d) is 0 and
    every gradient it receives is exactly 0.
    """
    rot_cam = viewmat[:3, :3] @ quat_to_rotmat(quats)  # [N, 3, 3]
    c = means @ viewmat[:3, :3].T + viewmat[:3, 3]  # [N, 3]
    in_range = depth_in_range(c[:, 2], near, far)  # [N]
    columns = torch.stack([rot_cam[:, :, 0] * scales[:, :1], rot_cam[:, :, 1] * scales[:, 1:2], c], dim=-1)
    columns = torch.where(in_range[:, None, None], columns, torch.zeros_like(columns))
    M = K @ columns  # [N, 3, 3]; M (u, v, 1) = homogeneous pixel
    _check_magnitude(M.detach(), in_range, None, width, height)
    safe_depth = torch.where(in_range, M[:, 2, 2], torch.ones_like(M[:, 2, 2]))  # [N]
    center = M[:, :2, 2] / safe_depth[:, None]  # [N, 2]; 0 for culled surfels
    with torch.no_grad():
        pixel_rect, radii = _screen_bounds(M.detach(), center.detach(), opacities.detach(), in_range, width, height)
        drawn = (pixel_rect[:, 2] > pixel_rect[:, 0]) & (pixel_rect[:, 3] > pixel_rect[:, 1])
    _check_magnitude(M.detach(), in_range, drawn, width, height)
    return {
        "Tuvw": M.reshape(-1, 9),
        "center": center,
        "depth": c[:, 2].detach().contiguous(),
        "normal": facing_normals(quats, means, viewmat),
        "pixel_rect": pixel_rect,
        "radii": radii,
        "fused": False,
    }


def _magnitude_limits(dtype):
    """(limit for surfels in the depth range, limit for drawn surfels): see _check_magnitude."""
    big = torch.finfo(dtype).max
    return big, big**0.25 / 16


def _project_fused(
    means, quats, scales, opacities, colors, viewmat, K, width, height, near, far, sh_degree, grad_enabled
):
    """_project and _surfel_colors fused into one op with an exact backward
    (splat/kernels/project_surfels.h: cpu/project_cpu.cpp on CPU tensors,
    one CUDA kernel each way, cuda/project.cu, on CUDA tensors), used when
    viewmat and K need no gradient.  Same outputs as the torch path up to
    float rounding (tests/test_projection.py).  means2d is folded in by the
    op's backward: its gradient is dL/d(screen translation), as in rasterize().

    Returns (proj dict as _project's, colours [N, 3], means2d)."""
    n = means.shape[0]
    means2d = torch.zeros(n, 2, dtype=means.dtype, device=means.device, requires_grad=grad_enabled)
    coeffs = colors if sh_degree is not None else colors.new_zeros(0, 0, 3)
    Tuvw, center, normal, color, depth, rect, radii, bad = _ProjectSurfels.apply(
        means,
        quats,
        scales,
        opacities,
        coeffs,
        means2d,
        viewmat,
        K,
        width,
        height,
        near,
        far,
        -1 if sh_degree is None else sh_degree,
    )
    if int(bad):  # let the torch path raise its error naming the rows (on CUDA: the one sync)
        _project(means, quats, scales, opacities, viewmat, K, width, height, near, far)
    with torch.no_grad():
        means2d.copy_(center)
    proj = {
        "Tuvw": Tuvw,
        "center": center,
        "depth": depth,
        "normal": normal,
        "pixel_rect": rect,
        "radii": radii,
        "fused": True,
    }
    return proj, (colors if sh_degree is None else color), means2d


class _ProjectSurfels(torch.autograd.Function):
    """The kernels' project_forward_cpu / project_backward_cpu, or their
    *_cuda twins on CUDA tensors.  Returns (Tuvw, centre, normal, colour,
    depth, pixel_rect, radii, bad count); means2d (value unused) receives
    dL/d(screen translation)."""

    @staticmethod
    def forward(ctx, means, quats, scales, opacities, coeffs, means2d, viewmat, K, width, height, near, far, sh_degree):
        ext = _backend.load_extension()  # not this module's name, which tests swap for the raster kernels
        args = [t.contiguous() for t in (means, quats, scales, opacities, coeffs)]
        cam = (viewmat.detach().contiguous(), K.detach().contiguous())
        project = ext.project_forward_cuda if means.is_cuda else ext.project_forward_cpu
        outs = project(*args, sh_degree, *cam, width, height, near, far, *_magnitude_limits(means.dtype))
        ctx.save_for_backward(*args, *cam)
        ctx.image = (width, height, near, far)
        ctx.sh_degree = sh_degree
        ctx.mark_non_differentiable(*outs[4:])
        return tuple(outs)

    @staticmethod
    def backward(ctx, v_Tuvw, v_center, v_normal, v_color, *_):
        ext = _backend.load_extension()
        means, quats, scales, opacities, coeffs, viewmat, K = ctx.saved_tensors
        width, height, near, far = ctx.image
        project = ext.project_backward_cuda if means.is_cuda else ext.project_backward_cpu
        v_means, v_quats, v_scales, v_coeffs, v_means2d = project(
            means,
            quats,
            scales,
            opacities,
            coeffs,
            ctx.sh_degree,
            viewmat,
            K,
            width,
            height,
            near,
            far,
            *(_unit_column_stride(g) for g in (v_Tuvw, v_center, v_normal, v_color)),
        )
        return (
            v_means,
            v_quats,
            v_scales,
            None,
            v_coeffs if ctx.sh_degree >= 0 else None,
            v_means2d,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _broadcast_over_pixels(g):
    """True when g ([H, W] or [H, W, C]) holds one value, or one per channel,
    for every pixel: zero strides over H and W."""
    return g.stride(0) == 0 and g.stride(1) == 0 and (g.dim() == 2 or g.stride(2) <= 1)


def _unit_column_stride(g):
    """g, or a contiguous copy where its columns are strided: the C++ op reads
    rows in place (the rasterizer's gradients arrive as column slices of its
    [N, 18] records, with row stride 18), needing only unit column stride."""
    return g if g.dim() == 2 and g.stride(1) == 1 and g.stride(0) >= g.shape[1] else g.contiguous()


def _check_magnitude(M, in_range, drawn, width, height):
    """Refuses surfels whose screen matrix M's dtype cannot carry.

    Every surfel in the depth range needs a finite M (drawn=None checks that).
    A drawn surfel needs more: the per-pixel core forms
    q = (Tu - x Tw) x (Tv - y Tw) and |q|^2, fourth powers of M's entries (and
    its gradients go no higher), so with h = max(|Tu|, |Tv|) + max(W, H) |Tw|
    every intermediate stays finite while h <= max_float^(1/4) / 16 (2.7e8 in
    float32, 8e75 in float64).  Beyond it float32 would silently turn the
    surfel into a low-pass blob or NaN.  Surfels off screen are never
    evaluated per pixel, so only their M must be finite.
    """
    dtype = M.dtype
    finite_limit, drawn_limit = _magnitude_limits(dtype)
    limit, check = (finite_limit, in_range) if drawn is None else (drawn_limit, drawn)
    M = M.double()
    h = M[:, :2].abs().amax((1, 2)) + max(width, height) * M[:, 2].abs().amax(-1)  # [N]
    bad = check & ~(h <= limit)
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"surfels at rows {rows} project to screen coordinates of magnitude {float(h[bad].max()):.3g}, "
            f"beyond what {dtype} can rasterize (limit {limit:.3g}): their means or scales (or the viewmat "
            f"translation, or K) are too large; rescale the scene or use float64"
        )


def depth_in_range(depth, near, far):
    """[N] bool: camera depths strictly inside (near, far), compared in float64
    so that every backend and the bounds agree on which surfels are culled."""
    depth = depth.detach().double()
    return (depth > near) & (depth < far)


def _screen_bounds(M, center, opacities, in_range, width, height):
    """Pixels each surfel may draw: int32 [N, 4] (x0, y0, x1, y1, exclusive), and radii [N].

    A pixel is drawn only where o exp(-rho / 2) >= 1/255, i.e. rho <= k^2 with
    k^2 = 2 ln(255 o), so bounding exactly that region loses nothing:
      * the 3D ellipse u^2 + v^2 <= k^2 projects to the conic whose dual is
        C* = M diag(1, 1, -1/k^2) M^T; its bounding box is
        x = C*_02 / C*_22 +- sqrt((C*_02 / C*_22)^2 - C*_00 / C*_22)
        (C*_22 >= 0 means the ellipse reaches the camera plane: whole screen);
      * the low-pass disc 2 |p - centre|^2 <= k^2.
    Computed in float64 with a one-pixel margin, so rounding never drops a pixel.
    """
    M = M.double()
    center = center.double()
    opac = opacities.double()
    k2 = 2.0 * torch.log(torch.clamp_min(opac * 255.0, 1e-30))
    visible = in_range & (opac >= cv.ALPHA_MIN) & (k2 > 1e-12)
    k2 = torch.where(visible, k2, torch.ones_like(k2))
    weights = torch.stack([torch.ones_like(k2), torch.ones_like(k2), -1.0 / k2], dim=-1)  # [N, 3]
    dual = (M * weights[:, None, :]) @ M.transpose(1, 2)  # [N, 3, 3]
    c22 = dual[:, 2, 2]
    bounded = c22 < 0
    c22 = torch.where(bounded, c22, -torch.ones_like(c22))
    mid = dual[:, :2, 2] / c22[:, None]  # [N, 2]
    half = torch.sqrt(torch.clamp_min(mid * mid - torch.stack([dual[:, 0, 0], dual[:, 1, 1]], -1) / c22[:, None], 0.0))
    disc = torch.sqrt(k2 / cv.LOWPASS_INV_VARIANCE)[:, None]  # [N, 1]
    lo = torch.minimum(mid - half, center - disc)
    hi = torch.maximum(mid + half, center + disc)
    screen = torch.tensor([width, height], dtype=lo.dtype, device=lo.device)
    lo = torch.where(bounded[:, None], lo, torch.zeros_like(lo))
    hi = torch.where(bounded[:, None], hi, screen.expand_as(hi))
    # Pixel j has its centre at j + 0.5: keep the j whose centre lies in [lo, hi], plus the margin.
    margin = 1.0
    screen_px = screen.long()
    first = torch.ceil(lo - 0.5 - margin).clamp(min=-1, max=max(width, height) + 1).long()
    last = torch.floor(hi - 0.5 + margin).clamp(min=-1, max=max(width, height) + 1).long() + 1
    first = torch.minimum(torch.clamp_min(first, 0), screen_px)
    last = torch.minimum(torch.clamp_min(last, 0), screen_px)
    visible &= (last > first).all(-1)
    rect = torch.cat([first, last], -1)
    rect = torch.where(visible[:, None], rect, torch.zeros_like(rect))
    extent = torch.maximum(hi - center, center - lo).amax(-1)
    radii = torch.where(visible, torch.ceil(torch.clamp_min(extent, 0.0)), torch.zeros_like(extent))
    radii = torch.where(bounded | ~visible, radii, torch.full_like(radii, float(max(width, height))))
    return rect.to(torch.int32).contiguous(), cv.radii_int32(radii)


# ---------------------------------------------------------------------------
# The autograd bridge to the compiled kernels
# ---------------------------------------------------------------------------
class RasterState(NamedTuple):
    """What a raster kernel's forward keeps for its backward, in the order the
    backward takes it (kernels/op_signatures.h SPLAT_BACKWARD_STATE_PARAMS)."""

    tile_offsets: torch.Tensor  # int64 [tiles + 1]
    point_list: torch.Tensor  # int32 [P] primitive ids, tile by tile, front to back
    end: torch.Tensor  # int32 [H, W]
    median_index: torch.Tensor  # int32 [H, W]
    transmittance: torch.Tensor  # [H, W]
    totals: torch.Tensor  # [H, W, kTotalsSize]


#: The kernels' forward results: the six raw sums of compose(), then these, then
#: any backend state (the CPU surfel kernels' packed records) for the backward.
_SUM_NAMES = ("color_sum", "transmittance", "depth_sum", "normal_sum", "distortion", "median_depth")
_BINNING_NAMES = ("end", "median_index", "totals", "tile_offsets", "point_list")


def raster_forward(ctx, kernel, inputs, width, height, near, far):
    """Runs a raster kernel's forward (``kernel(*inputs, width, height, near,
    far)``), saves its inputs and :class:`RasterState` (and any backend state)
    on ``ctx`` for :func:`raster_backward`, and returns the six raw sums."""
    inputs = [t.contiguous() for t in inputs]
    outs = kernel(*inputs, width, height, near, far)
    named = dict(zip(_SUM_NAMES + _BINNING_NAMES, outs))
    state = RasterState(**{k: named[k] for k in RasterState._fields})
    backend_state = outs[len(_SUM_NAMES) + len(_BINNING_NAMES) :]
    ctx.save_for_backward(*inputs, *state, *backend_state)
    ctx.num_inputs = len(inputs)
    ctx.image = (width, height, near, far)
    return tuple(named[k] for k in _SUM_NAMES)


def saved_inputs(ctx):
    """The kernel inputs :func:`raster_forward` saved (contiguous)."""
    return ctx.saved_tensors[: ctx.num_inputs]


def raster_backward(ctx, kernel, v_sums):
    """Runs a raster kernel's backward (``kernel(*inputs, width, height, near,
    far, *RasterState, *upstream, *backend state)``) on what
    :func:`raster_forward` saved and the six upstream gradients ``v_sums``;
    returns its per-primitive gradient records [N, record size]."""
    saved = ctx.saved_tensors
    inputs = saved[: ctx.num_inputs]
    state = RasterState(*saved[ctx.num_inputs : ctx.num_inputs + len(RasterState._fields)])
    backend_state = saved[ctx.num_inputs + len(RasterState._fields) :]
    width, height = ctx.image[:2]
    upstream = upstream_grads(inputs[0], height, width, *v_sums)
    return kernel(*inputs, *ctx.image, *state, *upstream, *backend_state)


class _RasterizeSurfels(torch.autograd.Function):
    """Per-pixel rasterization of surfels by splat._C.  Returns the raw sums of compose()."""

    @staticmethod
    def forward(ctx, Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far):
        ext = load_extension()
        kernel = ext.forward_cuda if Tuvw.is_cuda else ext.forward_cpu
        return raster_forward(
            ctx, kernel, (Tuvw, center, normal, color, opacity, depth, pixel_rect), width, height, near, far
        )

    @staticmethod
    def backward(ctx, *v_sums):
        ext = load_extension()
        kernel = ext.backward_cuda if saved_inputs(ctx)[0].is_cuda else ext.backward_cpu
        v = raster_backward(ctx, kernel, v_sums)  # [N, 18]: core.h's surfel gradient record
        v_Tuvw, v_center, v_normal, v_color, v_opacity = v[:, 0:9], v[:, 9:11], v[:, 11:14], v[:, 14:17], v[:, 17]
        return v_Tuvw, v_center, v_normal, v_color, v_opacity, None, None, None, None, None, None


def upstream_grads(like, H, W, v_color_sum, v_transmittance, v_depth_sum, v_normal_sum, v_distortion, v_median):
    """The six upstream gradients of the raw sums as the kernels' backward
    takes them: None becomes zeros; the CPU kernels also read a gradient
    broadcast to every pixel (stride 0: autograd's gradient of a sum or
    mean, or those zeros) in place; anything else is made contiguous."""

    def grad_or_zeros(g, *shape):
        if g is None:
            g = like.new_zeros(()).expand(shape)
        if like.is_cuda or not _broadcast_over_pixels(g):
            g = g.contiguous()
        return g

    return (
        grad_or_zeros(v_color_sum, H, W, 3),
        grad_or_zeros(v_transmittance, H, W),
        grad_or_zeros(v_depth_sum, H, W),
        grad_or_zeros(v_normal_sum, H, W, 3),
        grad_or_zeros(v_distortion, H, W),
        grad_or_zeros(v_median, H, W),
    )


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------
def _surfel_colors(means, colors, viewmat, sh_degree):
    if sh_degree is None:
        return colors
    dirs = means - camera_center(viewmat)
    dirs = dirs / torch.clamp_min(dirs.norm(dim=-1, keepdim=True), 1e-12)
    return torch.clamp_min(eval_sh(sh_degree, colors, dirs) + cv.SH_COLOR_OFFSET, 0.0)


def _empty_sums(width, height, dtype, device):
    """The raw sums of an image no surfel touches (see compose())."""
    zeros = torch.zeros(height, width, dtype=dtype, device=device)
    zeros3 = torch.zeros(height, width, 3, dtype=dtype, device=device)
    return zeros3, torch.ones_like(zeros), zeros, zeros3, zeros, zeros


def _resolve_backend(backend, device):
    if backend == "auto":
        if device.type == "cuda" and has_cuda_kernels():
            return "cuda"
        if device.type == "cpu" and has_extension():
            return "cpu"
        warnings.warn(
            "splat: compiled kernels unavailable for this device; using the slow torch reference", stacklevel=3
        )
        return "torch"
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"backend='cpu' needs CPU tensors, got tensors on {device}")
        load_extension()  # raises ImportError with the reason
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"backend='cuda' needs CUDA tensors, got tensors on {device}")
        if not has_cuda_kernels():
            raise RuntimeError(
                "backend='cuda': splat was built without CUDA kernels "
                "(reinstall with a CUDA build of torch and nvcc on the PATH)"
            )
    return backend


def _check_tensor(name, t, shape, dtype, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("N" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, but means has {dtype}; all inputs must share one dtype")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, but means is on {device}; all inputs must be on one device")


def _check_finite(name, t):
    if t.numel() and not bool(torch.isfinite(t).all()):
        finite = torch.isfinite(t)
        bad = (~finite).reshape(t.shape[0], -1).any(-1).nonzero().flatten()[:5].tolist() if t.dim() > 0 else []
        raise ValueError(f"{name} contains NaN or Inf (first bad rows: {bad})")


def _close(a, b, atol=1e-8, rtol=1e-5):
    """torch.allclose(a, b, rtol, atol) as a 0-dim bool tensor, without reading it back (False where it is
    unsure: inf == inf, which the exact test then clears)."""
    return ((a - b).abs() <= atol + rtol * b.abs()).all()


def _check_clip_range(near, far, dtype):
    """near and far as the kernels see them, in ``dtype``: far must not
    overflow (inf would make m(z) NaN), near must stay >= sqrt(tiny) so that
    d m / dz = far / (far - near) near / z^2 stays finite, and the two must
    remain distinct after rounding."""
    info = torch.finfo(dtype)
    if far > info.max:
        raise ValueError(f"far={far!r} is beyond the range of {dtype} (max {info.max:.3g})")
    if near < info.tiny**0.5:
        raise ValueError(f"near={near!r} is too small for {dtype} (need near >= {info.tiny**0.5:.3g})")
    # as the dtype rounds them (array's "f" is float32), without a tensor to read back
    near_t, far_t = array.array("f" if dtype == torch.float32 else "d", [near, far])
    if not near_t < far_t:
        raise ValueError(f"near={near!r} and far={far!r} round to the same {dtype} value; widen the range")


def _validate(
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
    num_scales=2,
    positive_scales=False,
):
    """The inputs' types, shapes, devices and values; raises a one-line error naming the argument.
    ``positive_scales``: scales must be > 0 (3D Gaussians), not only >= 0 (surfels)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(means, torch.Tensor):
        raise TypeError(f"means must be a torch.Tensor, got {type(means).__name__}")
    if means.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"means has dtype {means.dtype}; splat takes float32 or float64")
    if means.dim() != 2 or means.shape[1] != 3:
        raise ValueError(f"means must have shape [N, 3], got {list(means.shape)}")
    n, dtype, device = means.shape[0], means.dtype, means.device
    _check_tensor("means", means, (n, 3), dtype, device)
    _check_tensor("quats", quats, (n, 4), dtype, device)
    _check_tensor("scales", scales, (n, num_scales), dtype, device)
    _check_tensor("opacities", opacities, (n,), dtype, device)
    if sh_degree is None:
        _check_tensor("colors", colors, (n, 3), dtype, device)
    else:
        if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be None or an int in 0..3, got {sh_degree!r}")
        if not isinstance(colors, torch.Tensor) or colors.dim() != 3 or colors.shape[1] < num_sh_bases(sh_degree):
            got = list(colors.shape) if isinstance(colors, torch.Tensor) else type(colors).__name__
            raise ValueError(
                f"with sh_degree={sh_degree}, colors must be [N, >= {num_sh_bases(sh_degree)}, 3], got {got}"
            )
        _check_tensor("colors", colors, (n, None, 3), dtype, device)
    _check_tensor("viewmat", viewmat, (4, 4), dtype, device)
    _check_tensor("K", K, (3, 3), dtype, device)
    if background is not None:
        _check_tensor("background", background, (3,), dtype, device)
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
        if value > MAX_IMAGE_SIDE:
            raise ValueError(
                f"{name}={value} is larger than {MAX_IMAGE_SIDE} pixels (pixel rectangles and tile counts are int32)"
            )
    if not (isinstance(near, (int, float)) and isinstance(far, (int, float)) and 0 < near < far < math.inf):
        raise ValueError(f"need 0 < near < far < inf, got near={near!r}, far={far!r}")
    _check_clip_range(near, far, dtype)
    # The value tests below as one [k] bool tensor and one readback: on CUDA each float() or bool() of a
    # tensor waits for the GPU, and two dozen of them left it idle between the launches of a forward.
    # Only if one fails do the tests run again one by one, for the message (a sum that overflowed while
    # every element is finite fails the quick test and passes the exact one).
    named = [("means", means), ("quats", quats), ("scales", scales), ("opacities", opacities), ("colors", colors)]
    named += [("viewmat", viewmat), ("K", K)] + ([("background", background)] if background is not None else [])
    tol = 1e-4 if dtype == torch.float64 else 1e-3
    bottom = viewmat.new_tensor([0, 0, 0, 1])
    rot = viewmat.detach()[:3, :3]
    eye = torch.eye(3, dtype=dtype, device=device)
    k = K.detach()
    quick = [torch.isfinite(t.detach().sum()) for _, t in named if t.numel()]
    quick += [_close(viewmat.detach()[3], bottom), _close(rot @ rot.T, eye, atol=tol)]
    r = rot.double()
    quick += [torch.dot(r[0], torch.linalg.cross(r[1], r[2])) >= 0]  # det(rot), without a solver on CUDA
    quick += [(k[2] == k.new_tensor([0, 0, 1])).all(), k[0, 0] > 0, k[1, 1] > 0, k[1, 0] == 0]
    min_quat = torch.finfo(dtype).tiny ** 0.5
    if n:
        lo, hi = torch.aminmax(opacities.detach())
        quick += [quats.detach().abs().amax(dim=-1).amin() >= min_quat, lo >= 0, hi <= 1]
        quick += [scales.detach().amin() > 0 if positive_scales else scales.detach().amin() >= 0]
    if bool(torch.stack(quick).all()):
        return
    for name, t in named:
        _check_finite(name, t)
    _explain_values(quats, scales, opacities, viewmat, K, tol, min_quat, positive_scales)


def _explain_values(quats, scales, opacities, viewmat, K, tol, min_quat, positive_scales):
    """The value tests of :func:`_validate`, one at a time: raises naming the argument and rows."""
    dtype, device, n = viewmat.dtype, viewmat.device, quats.shape[0]
    bottom = viewmat.new_tensor([0, 0, 0, 1])
    rot = viewmat[:3, :3]
    if not torch.allclose(viewmat[3], bottom) or not torch.allclose(
        rot @ rot.T, torch.eye(3, dtype=dtype, device=device), atol=tol
    ):
        raise ValueError("viewmat must be a rigid world->camera transform: orthonormal rotation, last row (0, 0, 0, 1)")
    if float(torch.linalg.det(rot.detach().double())) < 0:
        raise ValueError(
            "viewmat must be a rigid world->camera transform, but its rotation has determinant -1 "
            "(a reflection: a handedness flip, e.g. OpenGL axes converted by negating one axis)"
        )
    if not torch.equal(K[2], K.new_tensor([0, 0, 1])) or K[0, 0] <= 0 or K[1, 1] <= 0 or K[1, 0] != 0:
        raise ValueError(f"K must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0, got {K.tolist()}")
    # Primitives
    if n:
        # Any larger finite quaternion is normalised exactly (reference.quat_to_rotmat
        # rescales it first); a smaller one has a gradient ~1/|q| the dtype cannot carry.
        if float(quats.detach().abs().amax(dim=-1).amin()) < min_quat:
            zero_quat = quats.abs().amax(dim=-1) < min_quat
            raise ValueError(
                f"quats has zero-length quaternions at rows {zero_quat.nonzero().flatten()[:5].tolist()} "
                f"(largest component below {min_quat:.2g}, too small to normalise in {dtype})"
            )
        if float(scales.detach().amin()) < 0:
            raise ValueError(
                f"scales must be >= 0 (they are standard deviations, not log-scales); "
                f"negative at rows {(scales < 0).any(-1).nonzero().flatten()[:5].tolist()}"
            )
        if positive_scales and float(scales.detach().amin()) <= 0:
            bad = (scales <= 0).any(-1).nonzero().flatten()[:5].tolist()
            raise ValueError(
                f"scales must be > 0 for 3D Gaussians (their depth needs the inverse covariance); not at rows {bad}"
            )
        lo, hi = torch.aminmax(opacities.detach())
        if float(lo) < 0 or float(hi) > 1:
            bad_opacity = (opacities < 0) | (opacities > 1)
            raise ValueError(
                f"opacities must lie in [0, 1] (probabilities, not logits); "
                f"out of range at rows {bad_opacity.nonzero().flatten()[:5].tolist()}"
            )
