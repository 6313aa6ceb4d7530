"""Loss terms and image metrics used by the trainer.

All image tensors are ``[H, W, C]`` (the layout :func:`splat.rasterize`
returns) unless a docstring says otherwise.

Total loss (see :func:`total_loss`)::

    L = (1 - λ_ssim) L1 + λ_ssim (1 - SSIM)                       photometric (3DGS, λ_ssim = 0.2)
      + λ_dist   mean(distortion)          once step >= dist_from    (2DGS depth distortion)
      + λ_normal mean(α (1 - <n_render, n_depth>)) once step >= normal_from  (2DGS normal consistency)

Why the geometric terms start late: early on surfels are placed and sized by
the photometric loss; pulling them onto thin layers (distortion) or aligning
them with a still-noisy depth map (normals) before that converges slows
convergence and costs PSNR (2DGS starts them at 3k / 7k of 30k steps).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Optional

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .outputs import RasterOutput


# --------------------------------------------------------------- photometric
def l1_loss(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """Mean absolute error."""
    return (pred - gt).abs().mean()


def _gaussian_1d(size: int, sigma: float, dtype, device) -> torch.Tensor:
    """Normalised 1D Gaussian. [size]"""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x**2) / (2.0 * sigma**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


#: SSIM stabilising constants (K1 L)^2, (K2 L)^2 with dynamic range L = 1.
SSIM_C1, SSIM_C2 = 0.01**2, 0.03**2


def ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    window_size: int = 11,
    sigma: float = 1.5,
    reduce: bool = True,
) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004) with an 11x11 Gaussian window, σ=1.5.

    img1, img2: [H, W, C] (or [B, C, H, W] if 4-D) in [0, 1].  Zero padding at
    the border, as in the 3DGS reference implementation, so numbers compare
    with published 3DGS/2DGS results.  Returns the mean SSIM (scalar) or the
    per-pixel map [B, C, H, W] with ``reduce=False``.

    Per pixel and channel, with mu, s the Gaussian-weighted local means,
    variances and covariance::

        SSIM = (2 mu_x mu_y + C1)(2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(s_x^2 + s_y^2 + C2))

    Speed (it runs every step): on the CPU, for [H, W, C] images where only
    ``img1`` needs a gradient and ``reduce=True`` (the training loss), a fused
    C++ op computes the mean and its exact gradient (splat/kernels/
    cpu/ssim_cpu.h, which writes out the maths); :func:`ssim_torch` is the same
    function in plain PyTorch, used everywhere else and as its test oracle.
    """
    if _fused_ssim_applies(img1, img2, reduce):
        window = _gaussian_1d(window_size, sigma, img1.dtype, img1.device)
        return _FusedSsim.apply(img1, img2, window)
    return ssim_torch(img1, img2, window_size, sigma, reduce)


def _cpu_kernels_take(*tensors) -> bool:
    """True when the fused C++ loss ops can run on these tensors: all on the
    CPU, of one float dtype, and the compiled kernels are available."""
    dtype = tensors[0].dtype
    if not (
        dtype in (torch.float32, torch.float64) and all(t.device.type == "cpu" and t.dtype == dtype for t in tensors)
    ):
        return False
    from ._backend import has_extension  # lazy: losses must import without the kernels

    return has_extension()


def _fused_ssim_applies(img1, img2, reduce) -> bool:
    return (
        reduce
        and img1.dim() == 3
        and img1.shape == img2.shape
        and not img2.requires_grad
        and _cpu_kernels_take(img1, img2)
    )


class _FusedSsim(torch.autograd.Function):
    """mean SSIM of [H, W, C] images by splat._C.ssim_forward_cpu / ssim_backward_cpu."""

    @staticmethod
    def forward(ctx, img1, img2, window):
        from ._backend import load_extension

        ext = load_extension()
        x, y = img1.detach().contiguous(), img2.detach().contiguous()
        mean, maps = ext.ssim_forward_cpu(x, y, window, SSIM_C1, SSIM_C2, img1.requires_grad)
        ctx.save_for_backward(x, y, window, maps)
        return mean

    @staticmethod
    def backward(ctx, grad):
        from ._backend import load_extension

        x, y, window, maps = ctx.saved_tensors
        scale = float(grad) / x.numel()  # d mean / d SSIM_i
        dx = load_extension().ssim_backward_cpu(x, y, window, SSIM_C1, SSIM_C2, maps, scale)
        return dx, None, None


def ssim_torch(
    img1: torch.Tensor,
    img2: torch.Tensor,
    window_size: int = 11,
    sigma: float = 1.5,
    reduce: bool = True,
) -> torch.Tensor:
    """:func:`ssim` in plain PyTorch, for any device, batch or reduction.

    The Gaussian window is separable, so the five local statistics (mu_x,
    mu_y, E[x^2], E[y^2], E[xy]) are filtered together by one depthwise 11x1
    and one 1x11 convolution over a [B, 5C, H, W] stack: the same result as
    the 11x11 window, to float rounding.
    """
    if img1.dim() == 3:
        img1 = img1.permute(2, 0, 1)[None]  # [1, C, H, W]
        img2 = img2.permute(2, 0, 1)[None]
    C = img1.shape[1]
    pad = window_size // 2
    g = _gaussian_1d(window_size, sigma, img1.dtype, img1.device)
    stack = torch.cat([img1, img2, img1 * img1, img2 * img2, img1 * img2], dim=1)  # [B, 5C, H, W]
    n = stack.shape[1]
    f = F.conv2d(stack, g.view(1, 1, -1, 1).expand(n, 1, -1, 1), padding=(pad, 0), groups=n)
    f = F.conv2d(f, g.view(1, 1, 1, -1).expand(n, 1, 1, -1), padding=(0, pad), groups=n)
    mu1, mu2, e11, e22, e12 = f.split(C, dim=1)  # each [B, C, H, W]
    mu1_sq, mu2_sq, mu12 = mu1 * mu1, mu2 * mu2, mu1 * mu2
    s1 = e11 - mu1_sq
    s2 = e22 - mu2_sq
    s12 = e12 - mu12
    C1, C2 = SSIM_C1, SSIM_C2
    ssim_map = ((2 * mu12 + C1) * (2 * s12 + C2)) / ((mu1_sq + mu2_sq + C1) * (s1 + s2 + C2))
    return ssim_map.mean() if reduce else ssim_map


def psnr(pred: torch.Tensor, gt: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1]."""
    return _mse_to_db(float(((pred.detach().clamp(0, 1) - gt) ** 2).mean()))


def _mse_to_db(mse: float) -> float:
    return float("inf") if mse <= 0 else -10.0 * math.log10(mse)


def masked_psnr(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor) -> Optional[float]:
    """PSNR in dB over the pixels inside ``mask`` only (``eval.masked``).

    pred, gt: [H, W, C] in [0, 1] (``pred`` is clamped); mask: [H, W] weights
    in [0, 1] (1 = object).  The MSE is averaged over the masked pixels and
    the channels, each pixel weighted by its mask value::

        MSE = sum_p m_p sum_c (pred_pc - gt_pc)^2 / (C sum_p m_p)

    (for a 0/1 mask: the plain MSE of the pixels inside it; nothing outside
    counts, so no compositing is needed).  ``None`` when the mask is empty."""
    w = mask.detach().to(torch.float64)[..., None]  # [H, W, 1]
    total = float(w.sum()) * pred.shape[-1]
    if total <= 0:
        return None
    err = (pred.detach().clamp(0, 1).to(torch.float64) - gt.to(torch.float64)) ** 2
    return _mse_to_db(float((w * err).sum()) / total)


def masked_ssim(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor, background: torch.Tensor) -> Optional[float]:
    """SSIM inside ``mask`` (``eval.masked``): render and photo are both
    composited over ``background`` with the mask as alpha (``x m + bg (1 - m)``,
    as ``data.masks=background`` composites training images, so the table and
    backdrop do not reach the object's pixels through the 11x11 window), then
    the per-pixel, per-channel SSIM map (:func:`ssim_torch`) is averaged over
    the masked pixels with weights ``m``::

        SSIM_masked = sum_p m_p sum_c SSIM_pc / (C sum_p m_p)

    pred, gt: [H, W, C] in [0, 1] (``pred`` is clamped); mask: [H, W] in
    [0, 1]; background: [C].  ``None`` when the mask is empty."""
    m = mask.detach().to(pred.dtype)[..., None]  # [H, W, 1]
    total = float(m.sum()) * pred.shape[-1]
    if total <= 0:
        return None
    bg = background.to(device=pred.device, dtype=pred.dtype).view(1, 1, -1) * (1.0 - m)
    smap = ssim_torch(pred.detach().clamp(0, 1) * m + bg, gt * m + bg, reduce=False)  # [1, C, H, W]
    return float((smap[0].permute(1, 2, 0).to(torch.float64) * m.to(torch.float64)).sum()) / total


def photometric_loss(pred: torch.Tensor, gt: torch.Tensor, ssim_lambda: float = 0.2) -> torch.Tensor:
    """(1 - λ) L1 + λ (1 - SSIM), the 3DGS image loss."""
    loss = l1_loss(pred, gt)
    if ssim_lambda > 0:
        loss = (1.0 - ssim_lambda) * loss + ssim_lambda * (1.0 - ssim(pred, gt))
    return loss


# ----------------------------------------------------------------- geometry
def depth_to_points(depth: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Unproject camera-space z through each pixel centre. depth [H, W] -> [H, W, 3] (camera space)."""
    H, W = depth.shape
    dt, dev = depth.dtype, depth.device
    j = torch.arange(W, dtype=dt, device=dev) + 0.5  # pixel centres (conventions.py)
    i = torch.arange(H, dtype=dt, device=dev) + 0.5
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    x = ((j[None, :] - cx) / fx).expand(H, W)
    y = ((i[:, None] - cy) / fy).expand(H, W)
    return torch.stack([x * depth, y * depth, depth], dim=-1)


def depth_to_normal(depth: torch.Tensor, K: torch.Tensor, viewmat: torch.Tensor) -> torch.Tensor:
    """Surface normals from a depth map, in world space, facing the camera.

    depth [H, W] camera z; K [3, 3]; viewmat [4, 4] world -> camera.
    Returns [H, W, 3] unit normals; zero on the 1-pixel border (no central
    difference there) and where the depth is 0.

    Central differences of the unprojected points give two tangents; their
    cross product is the normal.  ``cross(d/di, d/dj)`` with i down, j right
    points towards the camera for a fronto-parallel plane; any normal still
    pointing away (n . p > 0) is flipped so the result always faces the camera,
    matching the rasterizer's normal convention.
    """
    pts = depth_to_points(depth, K)  # [H, W, 3]
    n = torch.zeros_like(pts)
    if depth.shape[0] < 3 or depth.shape[1] < 3:
        return n
    dj = pts[1:-1, 2:] - pts[1:-1, :-2]  # [H-2, W-2, 3] along +x (columns)
    di = pts[2:, 1:-1] - pts[:-2, 1:-1]  # [H-2, W-2, 3] along +y (rows)
    c = torch.cross(di, dj, dim=-1)
    c = c / c.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    facing = torch.where((c * pts[1:-1, 1:-1]).sum(-1, keepdim=True) > 0, -c, c)
    valid = (depth[1:-1, 1:-1] > 0)[..., None]
    n[1:-1, 1:-1] = facing * valid
    R = viewmat[:3, :3].to(n.dtype)  # world -> camera rotation
    return n @ R  # n_world = R^T n_cam, row-vector form


def image_edge_weight(image: torch.Tensor) -> torch.Tensor:
    """Per-pixel weight (1 - g)^2 that fades a geometric term at the photo's
    edges (PGSR's ``get_img_grad_weight``).  image [H, W, C] -> [H, W].

    g is the larger of the channel-mean absolute central differences along
    x and y, ``max(mean_c |I[y, x+1] - I[y, x-1]|, mean_c |I[y+1, x] - I[y-1, x]|)``,
    min-max normalised over the image's interior to [0, 1]; the 1-pixel
    border (no central difference) gets g = 1, weight 0, and a flat interior
    (max = min) g = 0, weight 1.  An edge in the photo is where a depth
    discontinuity is likely, and there the normals from depth differences
    point along the discontinuity, not the surface.  No gradient: the weight
    depends on the photo only.
    """
    img = image.detach()
    H, W = img.shape[:2]
    w = torch.zeros(H, W, dtype=img.dtype, device=img.device)
    if H < 3 or W < 3:
        return w
    gx = (img[1:-1, 2:] - img[1:-1, :-2]).abs().mean(-1)  # [H-2, W-2]
    gy = (img[2:, 1:-1] - img[:-2, 1:-1]).abs().mean(-1)
    g = torch.maximum(gx, gy)
    lo, hi = g.min(), g.max()
    g = (g - lo) / (hi - lo) if float(hi - lo) > 0 else torch.zeros_like(g)
    w[1:-1, 1:-1] = (1.0 - g) ** 2
    return w


def depth_jump_weight(depth: torch.Tensor, max_bend: float) -> torch.Tensor:
    """Per-pixel weight, 1 where the depth is locally one plane and 0 across
    a depth discontinuity, for the normal term.  depth [H, W] -> [H, W].

    The inverse depth u = 1/z of any plane is affine in the pixel
    coordinates (n . X = c with X = z K^-1 [x, y, 1] gives
    u = n . K^-1 [x, y, 1] / c), so its second central differences vanish
    on a plane at any tilt.  A pixel keeps weight 1 when
    ``max(|u[y, x-1] - 2 u + u[y, x+1]|, |u[y-1, x] - 2 u + u[y+1, x]|) <= max_bend * u``:
    between two surfaces the inverse depth bends by about the relative
    depth jump, and there the normal from central differences (which
    straddle the jump) points along the gap, not along either surface.
    The 1-pixel border, uncovered pixels (z = 0) and their neighbours get 0.
    No gradient: the weight selects pixels, as alpha does.
    """
    z = depth.detach()
    H, W = z.shape
    w = torch.zeros(H, W, dtype=z.dtype, device=z.device)
    if H < 3 or W < 3:
        return w
    covered = z > 0
    u = torch.where(covered, 1.0 / torch.where(covered, z, torch.ones_like(z)), torch.zeros_like(z))
    c = u[1:-1, 1:-1]
    bend = torch.maximum((u[1:-1, :-2] - 2 * c + u[1:-1, 2:]).abs(), (u[:-2, 1:-1] - 2 * c + u[2:, 1:-1]).abs())
    all_covered = covered[1:-1, 1:-1] & covered[1:-1, :-2] & covered[1:-1, 2:] & covered[:-2, 1:-1] & covered[2:, 1:-1]
    w[1:-1, 1:-1] = (all_covered & (bend <= max_bend * c)).to(z.dtype)
    return w


def distortion_loss(distortion: torch.Tensor) -> torch.Tensor:
    """Mean of the rasterizer's per-pixel depth distortion (2DGS eq. 13)."""
    return distortion.mean()


def normal_consistency_loss(
    rendered_normal: torch.Tensor,  # [H, W, 3] sum_i w_i n_i (world, not normalised)
    depth_normal: torch.Tensor,  # [H, W, 3] unit normals from depth (world)
    alpha: torch.Tensor,  # [H, W]
) -> torch.Tensor:
    """mean(α (1 - <n_render, n_depth>)) (2DGS eq. 14).

    ``alpha`` is detached: the term should align surfels with the surface the
    depth describes, not change coverage.  ``n_depth`` is *not* detached, so
    depth (surfel positions) and normals pull towards each other, as in 2DGS.
    The rendered normal is left unnormalised (its length is ≈ α), again as in
    2DGS, which avoids dividing by tiny α at silhouettes.
    """
    dot = (rendered_normal * depth_normal).sum(dim=-1)  # [H, W]
    return (alpha.detach() * (1.0 - dot)).mean()


def depth_normal_consistency_loss(
    depth: torch.Tensor,  # [H, W] camera z
    rendered_normal: torch.Tensor,  # [H, W, 3] sum_i w_i n_i (world)
    alpha: torch.Tensor,  # [H, W]
    K: torch.Tensor,  # [3, 3]
    viewmat: torch.Tensor,  # [4, 4] world -> camera
) -> torch.Tensor:
    """``normal_consistency_loss(rendered_normal, depth_to_normal(depth, K, viewmat), alpha)``.

    On the CPU, when K and viewmat need no gradient, one fused C++ op computes
    it and its exact gradient for depth and rendered_normal
    (splat/kernels/cpu/normal_loss_cpu.h, which writes out the maths)
    instead of ~30 whole-image torch ops; elsewhere the two functions above.
    """
    if K.requires_grad or viewmat.requires_grad or not _cpu_kernels_take(depth, rendered_normal):
        return normal_consistency_loss(rendered_normal, depth_to_normal(depth, K, viewmat), alpha)
    return _FusedNormalLoss.apply(depth, rendered_normal, alpha.detach().to(depth.dtype), K, viewmat)


class _FusedNormalLoss(torch.autograd.Function):
    """splat._C.normal_loss_forward_cpu / normal_loss_backward_cpu."""

    @staticmethod
    def forward(ctx, depth, normal, alpha, K, viewmat):
        from ._backend import load_extension

        args = (
            depth.detach().contiguous(),
            normal.detach().contiguous(),
            alpha.contiguous(),
            K.detach(),
            viewmat.detach(),
        )
        ctx.save_for_backward(*args)
        return load_extension().normal_loss_forward_cpu(*args)

    @staticmethod
    def backward(ctx, grad):
        from ._backend import load_extension

        v_depth, v_normal = load_extension().normal_loss_backward_cpu(*ctx.saved_tensors, float(grad))
        return v_depth, v_normal, None, None, None


#: The names of :func:`total_loss`'s terms besides the loss itself.
LOSS_TERMS = ("photo", "dist", "normal")


def total_loss(
    out: RasterOutput,
    gt: torch.Tensor,  # [H, W, 3]
    K: torch.Tensor,
    viewmat: torch.Tensor,
    step: int,
    cfg: Dict,
) -> tuple:
    """The training loss for one view; returns ``(loss, terms)`` where terms
    holds detached floats for logging.

    ``cfg`` is the ``loss`` section of the config: ``ssim_lambda``,
    ``dist_lambda``, ``dist_from``, ``normal_lambda``, ``normal_from``,
    ``depth_for_normal`` (``"expected"`` or ``"median"``), ``normal_edge_weight``
    (the normal term's per-pixel weight α times :func:`image_edge_weight` of ``gt``),
    ``normal_max_bend`` (> 0: times :func:`depth_jump_weight` of that depth),
    ``normal_depth_gradient`` (false: the depth is detached in the normal term).
    """
    loss = photometric_loss(out.rgb, gt, cfg.get("ssim_lambda", 0.2))
    terms = {"photo": float(loss.detach())}
    if cfg.get("dist_lambda", 0) > 0 and step >= cfg.get("dist_from", 0):
        d = distortion_loss(out.distortion)
        loss = loss + cfg["dist_lambda"] * d
        terms["dist"] = float(d.detach())
    if cfg.get("normal_lambda", 0) > 0 and step >= cfg.get("normal_from", 0):
        depth = out.median_depth if cfg.get("depth_for_normal", "expected") == "median" else out.depth
        weight = out.alpha * image_edge_weight(gt) if cfg.get("normal_edge_weight", False) else out.alpha
        if cfg.get("normal_max_bend", 0.0) > 0:
            weight = weight * depth_jump_weight(depth, cfg["normal_max_bend"])
        if not cfg.get("normal_depth_gradient", True):  # the term turns surfels; it does not move the depth
            depth = depth.detach()
        nc = depth_normal_consistency_loss(depth, out.normal, weight, K, viewmat)
        loss = loss + cfg["normal_lambda"] * nc
        terms["normal"] = float(nc.detach())
    return loss, terms
