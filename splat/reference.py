"""The plain-PyTorch reference rasterizer: the oracle for every test.

Slow and direct.  It shares nothing with the kernels' maths: where the kernels
intersect two screen planes in surfel coordinates, this solves the ray-plane
system in camera space by Cramer's rule, and it blends with cumulative
products instead of a loop.  For every pixel (x, y) (centres at j + 0.5,
i + 0.5) and surfel i, sorted front to back by the camera depth of its centre:

    ray      d = K^-1 (x, y, 1)
    surfel   c + u a + v b,  a = s_u R t_u,  b = s_v R t_v  (camera space)
    solve    c + u a + v b = t d          ->  u, v, z = t d_z
    rho      min(u^2 + v^2, 2 |centre_px - (x, y)|^2)   (low-pass fallback; z = c_z there)
    alpha    min(0.99, o exp(-rho / 2)),   skipped if < 1/255 or z <= near
    T_i      prod_{j<i} (1 - alpha_j),     stop before T would drop below 1e-4
    w_i      alpha_i T_i
"""

from __future__ import annotations

import torch

from . import conventions as cv
from .geometry import quat_to_rotmat


def camera_center(viewmat: torch.Tensor) -> torch.Tensor:
    """World position [3] of the camera of a world->camera matrix [4, 4]."""
    return -viewmat[:3, :3].T @ viewmat[:3, 3]


def facing_normals(quats: torch.Tensor, means: torch.Tensor, viewmat: torch.Tensor) -> torch.Tensor:
    """World-space surfel normals [N, 3] (third rotation column), flipped towards the camera.

    A plane not through the camera faces it from one side only, so one flip per
    surfel is exact for every pixel.
    """
    normals = quat_to_rotmat(quats)[:, :, 2]
    away = ((means - camera_center(viewmat)) * normals).sum(-1, keepdim=True) > 0
    return torch.where(away, -normals, normals)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=1) - x


def rasterize_reference(
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
    means2d=None,
    max_pairs_per_chunk=1 << 22,
):
    """Raw per-pixel sums, as the kernels produce them.

    colors [N, 3] are final colours (SH already evaluated).  ``means2d`` [N, 2]
    (optional) moves each footprint in screen space by ``means2d - centre``; its
    value equals the centre, so only its gradient matters.

    Returns (color_sum [H,W,3], transmittance [H,W], depth_sum [H,W],
    normal_sum [H,W,3], distortion [H,W], median_depth [H,W]).
    """
    dtype, device = means.dtype, means.device
    c = means @ viewmat[:3, :3].T + viewmat[:3, 3]  # [N, 3] camera-space centres
    depth = c[:, 2].detach().double()  # culling compared in float64, as in splat.rasterize
    keep = (depth > near) & (depth < far) & (opacities >= cv.ALPHA_MIN)
    ids = torch.nonzero(keep).squeeze(1)
    ids = ids[torch.sort(c[ids, 2], stable=True).indices]  # front to back
    # Everything below sees only the kept surfels: a culled one (say at depth
    # 0) never reaches a division, so its gradients are exactly 0, not NaN.
    c = c[ids]
    rot_cam = viewmat[:3, :3] @ quat_to_rotmat(quats[ids])  # [n, 3, 3]
    a = rot_cam[:, :, 0] * scales[ids, :1]  # [n, 3]
    b = rot_cam[:, :, 1] * scales[ids, 1:2]  # [n, 3]
    normals = facing_normals(quats[ids], means[ids], viewmat)  # [n, 3]
    centre = (c @ K.T)[:, :2] / c[:, 2:3]  # [n, 2] pixels
    shift = torch.zeros_like(centre) if means2d is None else means2d[ids] - centre.detach()
    centre = centre + shift
    opac, col = opacities[ids], colors[ids]
    n_cam = torch.cross(a, b, dim=-1)  # [n, 3]
    c_cross_b = torch.cross(c, b, dim=-1)
    c_cross_a = torch.cross(c, a, dim=-1)
    K_inv = torch.linalg.inv(K)

    def per_pair(p, sel):
        """alpha, z, validity, normals for pixels p [P, 2] against the surfels ``sel``."""
        sample = p[:, None, :] - shift[sel][None]  # [P, n, 2] footprint moved by the shift
        d = sample[..., :1] * K_inv[:, 0] + sample[..., 1:] * K_inv[:, 1] + K_inv[:, 2]  # [P, n, 3]
        den = (d * n_cam[sel]).sum(-1)
        u_num = -(d * c_cross_b[sel]).sum(-1)
        v_num = (d * c_cross_a[sel]).sum(-1)
        offset = centre[sel][None] - p[:, None, :]
        rho_2d = cv.LOWPASS_INV_VARIANCE * (offset**2).sum(-1)
        use_3d = u_num**2 + v_num**2 < rho_2d * den**2  # u^2 + v^2 < rho_2d, no division
        den = torch.where(use_3d, den, torch.ones_like(den))
        u, v = u_num / den, v_num / den
        z_3d = (c[sel] * n_cam[sel]).sum(-1) / den * d[..., 2]
        rho = torch.where(use_3d, u * u + v * v, rho_2d)
        z = torch.where(use_3d, z_3d, c[sel, 2].expand_as(z_3d))
        alpha = torch.clamp_max(opac[sel] * torch.exp(-0.5 * rho), cv.ALPHA_MAX)
        valid = (alpha >= cv.ALPHA_MIN) & (z > near)
        return alpha, z, valid, normals[sel]

    return composite_image(per_pair, ids.numel(), col, width, height, near, far, dtype, device, max_pairs_per_chunk)


def composite_image(per_pair, n, colors, width, height, near, far, dtype, device, max_pairs_per_chunk):
    """Every pixel of a ``width`` x ``height`` image, in chunks of about
    ``max_pairs_per_chunk`` (pixel, primitive) pairs, against the ``n``
    primitives (already in depth order) that touch each chunk.

    ``per_pair(p, sel)`` gives, for pixel centres p [P, 2] and the primitives
    ``sel`` (indices or a slice): (alpha [P, s], z [P, s], valid [P, s],
    normals [s, 3] or [P, s, 3]).  ``colors`` [n, 3].  Returns the six raw sums
    of :func:`rasterize_reference`, shaped as the image."""
    rows, cols = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype), torch.arange(width, device=device, dtype=dtype), indexing="ij"
    )
    pix = torch.stack([cols.reshape(-1), rows.reshape(-1)], -1) + cv.pixel_centers_offset()  # [HW, 2]
    n_pix = pix.shape[0]
    chunk = max(1, min(n_pix, max_pairs_per_chunk // max(1, n)))
    pieces = []
    for start in range(0, n_pix, chunk):
        p = pix[start : start + chunk]
        with torch.no_grad():  # which primitives touch this chunk at all
            valid = per_pair(p, slice(None))[2]
            sel = torch.nonzero(valid.any(0)).squeeze(1)
        alpha, z, valid, normals = per_pair(p, sel)
        pieces.append(composite_samples(p.shape[0], alpha, z, valid, colors[sel], normals, near, far, dtype, device))
    outputs = [torch.cat(parts, 0) for parts in zip(*pieces)]
    shapes = [
        (height, width, 3),
        (height, width),
        (height, width),
        (height, width, 3),
        (height, width),
        (height, width),
    ]
    return tuple(o.reshape(s) for o, s in zip(outputs, shapes))


def composite_samples(n_pix, alpha, z, valid, colors, normals, near, far, dtype, device):
    """Front-to-back compositing of [P, n] samples already in depth order.

    ``normals``: [n, 3] (one per primitive: surfels) or [P, n, 3] (one per
    sample: 3D Gaussians, splat/reference_3dgs.py)."""
    if alpha.shape[1] == 0:
        zeros = torch.zeros(n_pix, dtype=dtype, device=device)
        return (
            torch.zeros(n_pix, 3, dtype=dtype, device=device),
            torch.ones_like(zeros),
            zeros,
            torch.zeros(n_pix, 3, dtype=dtype, device=device),
            zeros,
            zeros,
        )
    alpha = torch.where(valid, alpha, torch.zeros_like(alpha))
    # A pixel stops at the first surfel that would take T below the floor.
    stop = torch.cumprod(1 - alpha, dim=1) < cv.TRANSMITTANCE_MIN
    alpha = torch.where(stop, torch.zeros_like(alpha), alpha)
    trans_after = torch.cumprod(1 - alpha, dim=1)
    trans_before = torch.cat([torch.ones_like(alpha[:, :1]), trans_after[:, :-1]], dim=1)
    w = alpha * trans_before  # [P, n]
    z = torch.where(valid, z, torch.ones_like(z))
    m = cv.normalized_depth(z, near, far)
    distortion = (
        w * (m * m * _exclusive_cumsum(w) + _exclusive_cumsum(w * m * m) - 2 * m * _exclusive_cumsum(w * m))
    ).sum(1)
    in_median = (w > 0) & (trans_before > cv.MEDIAN_TRANSMITTANCE)
    order = torch.arange(1, alpha.shape[1] + 1, device=device)
    last = (in_median * order).argmax(dim=1, keepdim=True)
    median = torch.where(in_median.any(1), z.gather(1, last).squeeze(1), torch.zeros_like(z[:, 0]))
    normal_sum = w @ normals if normals.dim() == 2 else (w[..., None] * normals).sum(1)
    return (w @ colors, trans_after[:, -1], (w * z).sum(1), normal_sum, distortion, median)
