"""The plain-PyTorch reference for **3D Gaussians**: the oracle for
the 3DGS kernels, as :mod:`splat.reference` is for surfels.

Slow and direct; every sample is computed for every pixel, and the blending,
median and distortion are the surfels' own
(:func:`splat.reference.composite_image`).  Only the per-pixel evaluation
differs.  For a Gaussian with mean mu, rotation R (from its quaternion) and
scales s = (s1, s2, s3), seen by a camera ``viewmat`` = [W | t] (world ->
camera, OpenCV axes) with intrinsics K (fx, fy, cx, cy):

Projection (EWA splatting, as INRIA's 3DGS and gsplat)::

    mu_c  = W mu + t,   Sigma_c = W R diag(s^2) R^T W^T,   P_c = Sigma_c^-1
    m     = (fx x/z + cx, fy y/z + cy)                     the centre in pixels
    J     = [[fx/z, 0, -fx x'/z^2], [0, fy/z, -fy y'/z^2]] at mu_c, with
            x'/z, y'/z clamped to the view frustum widened by 0.3 tan(fov/2)
            on each side (gsplat's limits; INRIA's 1.3 tan(fov/2) when cx = W/2)
    S     = J Sigma_c J^T + EWA_DILATION I                 (0.3 px^2: 3DGS's screen-space dilation)
    opacity o' = o, or, **antialiased** (Mip-Splatting, gsplat's
            ``rasterize_mode="antialiased"``), o sqrt(det(S - EWA_DILATION I) / det S)

At the pixel centre p (conventions.py: (j + 0.5, i + 0.5))::

    delta = p - m,   sigma = delta^T S^-1 delta / 2,   alpha = min(ALPHA_MAX, o' exp(-sigma))

Depth of the sample: the depth along the pixel's ray at which the Gaussian's
**density peaks** (the ray-Gaussian intersection of GOF and RaDe-GS)::

    d  = K^-1 (p, 1)                  the ray, camera space, d_z = 1
    t* = d^T P_c mu_c / d^T P_c d     argmax_t exp(-(t d - mu_c)^T P_c (t d - mu_c) / 2)
    x* = t* d,   z = t*               (camera depth, since d_z = 1)

Normal of the sample, taken there: over the pixels, the peaks x* of one
Gaussian sweep the quadric {x : x^T P_c (x - mu_c) = 0} (through the camera
centre and mu_c), so a single opaque Gaussian renders exactly that surface
as its depth map.  Its normal at x*::

    n = P_c (2 x* - mu_c),  flipped to face the camera (n . x* < 0), normalised, rotated to world

so the rendered normal is the normal of the rendered depth, and the
normal-consistency loss is consistent for one Gaussian.  For a flat Gaussian
(s3 -> 0) n tends to the third rotation column, the surfel's normal.

A sample counts where alpha >= ALPHA_MIN and z > near (no 3-sigma box: the
kernels' bounds must cover every pixel with alpha >= ALPHA_MIN).  Gaussians
are culled when their centre's depth is not in (near, far) or o < ALPHA_MIN,
and blended front to back in the order of their centre's depth, as the tile
pipeline sorts them; from there on, the transmittance stop, the median and
the distortion sum_i sum_{j<i} w_i w_j (m_i - m_j)^2 are the surfels'.
"""

from __future__ import annotations

import torch

from . import conventions as cv
from .geometry import quat_to_rotmat
from .reference import composite_image

__all__ = ["project_gaussians", "sample_depth_and_normal", "rasterize_reference_3dgs"]


def project_gaussians(means, quats, scales, viewmat, K, width: int, height: int, antialiased: bool = False):
    """EWA projection of 3D Gaussians (module doc).

    means [N, 3], quats [N, 4] (w, x, y, z), scales [N, 3], viewmat [4, 4],
    K [3, 3].  Returns (mu_c [N, 3], precision_c [N, 3, 3] (Sigma_c^-1 times a positive
    factor per Gaussian, largest eigenvalue 1), centre [N, 2] px,
    conic [N, 2, 2] = S^-1, opacity factor [N]: 1, or the antialiasing
    compensation sqrt(det(S - eps I) / det S))."""
    W, t = viewmat[:3, :3], viewmat[:3, 3]
    # Sums written out rather than ``means @ W.T``: a BLAS product fuses
    # multiply-adds on some CPUs (MKL on AVX-512 Intel) and not on others, and
    # the centre and depth must round the same everywhere, as the kernels'
    # (project_gaussians.h: (m0 W_r0 + m1 W_r1 + m2 W_r2) + t_r), since they
    # decide culling, tiles and the sort.
    mu = (means[:, 0:1] * W[:, 0] + means[:, 1:2] * W[:, 1] + means[:, 2:3] * W[:, 2]) + t  # [N, 3]
    rot = W @ quat_to_rotmat(quats)  # [N, 3, 3] camera-space axes
    cov = rot @ torch.diag_embed(scales * scales) @ rot.transpose(1, 2)  # [N, 3, 3]
    # P_c up to a positive factor per Gaussian: the peak depth and the
    # normalised normal do not change when P is scaled, so it is normalised to
    # largest eigenvalue 1 (1 / s^2 alone overflows float32 for s < 1e-19, and
    # its products much sooner).  The factor is detached: the exact gradient
    # through it is zero.
    s_min = scales.detach().amin(-1, keepdim=True)  # [N, 1]
    precision = rot @ torch.diag_embed((s_min / scales) ** 2) @ rot.transpose(1, 2)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    x, y, z = mu.unbind(-1)
    tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
    # The affine approximation is taken where the centre is, clamped to a
    # slightly widened frustum: a Gaussian far outside the image would
    # otherwise get a huge, skewed footprint (gsplat's limits).
    tx = z * torch.clamp(x / z, min=-(cx / fx + 0.3 * tan_x), max=(width - cx) / fx + 0.3 * tan_x)
    ty = z * torch.clamp(y / z, min=-(cy / fy + 0.3 * tan_y), max=(height - cy) / fy + 0.3 * tan_y)
    zero = torch.zeros_like(z)
    J = torch.stack([fx / z, zero, -fx * tx / (z * z), zero, fy / z, -fy * ty / (z * z)], -1).reshape(-1, 2, 3)
    cov2d = J @ cov @ J.transpose(1, 2)  # [N, 2, 2]
    S = cov2d + cv.EWA_DILATION * torch.eye(2, dtype=means.dtype, device=means.device)
    # The determinants are taken of S / s and cov2d / s, s a power of two near
    # S's largest entry: det S alone overflows float32 once S passes ~1e19 px^2
    # (a Gaussian e^19 wide close to the camera), which made the conic 0 and
    # the Gaussian silently vanish.  Scaling by a power of two is exact, so
    # every value (and, s being a detached constant, every gradient) is what
    # it was wherever det S did not overflow.
    s = _power_of_two_near(S.detach().abs().amax((1, 2)))[:, None, None]  # [N, 1, 1]
    Sn, cn = S / s, cov2d / s
    det = Sn[:, 0, 0] * Sn[:, 1, 1] - Sn[:, 0, 1] * Sn[:, 1, 0]  # det S / s^2
    det_orig = cn[:, 0, 0] * cn[:, 1, 1] - cn[:, 0, 1] * cn[:, 1, 0]
    adj = torch.stack([Sn[:, 1, 1], -Sn[:, 0, 1], -Sn[:, 1, 0], Sn[:, 0, 0]], -1).reshape(-1, 2, 2)  # adj S / s
    conic = adj / det[:, None, None] / s  # S^-1
    centre = torch.stack([fx * x / z + cx, fy * y / z + cy], -1)
    factor = torch.sqrt(torch.clamp(det_orig / det, min=0.0)) if antialiased else torch.ones_like(det)
    return mu, precision, centre, conic, factor


def _power_of_two_near(x: torch.Tensor) -> torch.Tensor:
    """2^e with x = m 2^e, 0.5 <= m < 1 (1 where x is 0 or not finite, so
    that an overflow still shows as one downstream)."""
    _, e = torch.frexp(x)
    one = torch.ones_like(x)
    return torch.where(torch.isfinite(x) & (x > 0), torch.ldexp(one, e), one)


def sample_depth_and_normal(rays, mu, precision):
    """Peak depth and normal of each (pixel, Gaussian) sample (module doc).

    rays [P, n, 3] camera space with z = 1 (one per pixel and Gaussian); mu
    [n, 3], precision [n, 3, 3] camera space.  Returns (z [P, n], normal
    [P, n, 3] camera space, unit, facing the camera)."""
    Pd = torch.einsum("nij,pnj->pni", precision, rays)  # [P, n, 3] P_c d
    t = (Pd * mu[None]).sum(-1) / (Pd * rays).sum(-1)  # [P, n]: d^T P mu / d^T P d (P symmetric)
    x = t[..., None] * rays  # [P, n, 3] the peaks
    n = torch.einsum("nij,pnj->pni", precision, 2.0 * x - mu[None])
    n = torch.where((n * x).sum(-1, keepdim=True) > 0, -n, n)
    # z = t: the rays have d_z = 1 (K's last row is (0, 0, 1)); t d_z would
    # be the same value but another gradient for K's fixed last row.
    return t, n / n.norm(dim=-1, keepdim=True)


def rasterize_reference_3dgs(
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
    antialiased: bool = False,
    max_pairs_per_chunk=1 << 21,
):
    """Raw per-pixel sums for 3D Gaussians, in the form of
    :func:`splat.reference.rasterize_reference`.

    means [N, 3], quats [N, 4], scales [N, 3] (three, positive), opacities
    [N], colors [N, 3] final colours; viewmat [4, 4], K [3, 3].  ``means2d``
    [N, 2] (optional) moves each footprint in screen space by
    ``means2d - centre`` (value 0: only its gradient matters, dL/d centre).
    ``antialiased``: Mip-Splatting's opacity compensation (module doc).

    Returns (color_sum [H,W,3], transmittance [H,W], depth_sum [H,W],
    normal_sum [H,W,3] (world), distortion [H,W], median_depth [H,W])."""
    dtype, device = means.dtype, means.device
    depth = (means @ viewmat[2, :3] + viewmat[2, 3]).detach().double()  # [N] centre depths
    keep = (depth > near) & (depth < far) & (opacities >= cv.ALPHA_MIN)
    ids = torch.nonzero(keep).squeeze(1)
    ids = ids[torch.sort(depth[ids], stable=True).indices]  # front to back by centre depth
    mu, precision, centre, conic, factor = project_gaussians(
        means[ids], quats[ids], scales[ids], viewmat, K, width, height, antialiased
    )
    shift = torch.zeros_like(centre) if means2d is None else means2d[ids] - centre.detach()
    centre = centre + shift
    opac = opacities[ids] * factor
    col = colors[ids]
    K_inv = torch.linalg.inv(K)
    W = viewmat[:3, :3]

    def per_pair(p, sel):
        """alpha, z, validity, world normals for pixels p [P, 2] against the Gaussians ``sel``."""
        delta = p[:, None, :] - centre[sel][None]  # [P, n, 2]
        sigma = 0.5 * torch.einsum("pni,nij,pnj->pn", delta, conic[sel], delta)
        alpha = torch.clamp_max(opac[sel] * torch.exp(-sigma), cv.ALPHA_MAX)
        # The whole footprint moves with the shift: the sample's ray is that
        # of the pixel taken back by it, as for surfels.
        sample = p[:, None, :] - shift[sel][None]  # [P, n, 2]
        rays = sample[..., :1] * K_inv[:, 0] + sample[..., 1:] * K_inv[:, 1] + K_inv[:, 2]  # [P, n, 3]
        z, normal_cam = sample_depth_and_normal(rays, mu[sel], precision[sel])
        normal = normal_cam @ W  # camera -> world: W^T n, row by row
        # Normalised after the rotation too, as the kernels do: the same value,
        # and the same gradient for viewmat's rotation entries off SO(3).
        normal = normal / normal.norm(dim=-1, keepdim=True)
        valid = (alpha >= cv.ALPHA_MIN) & (z > near)
        return alpha, z, valid, normal

    return composite_image(per_pair, ids.numel(), col, width, height, near, far, dtype, device, max_pairs_per_chunk)
