"""Multi-view geometric and photometric consistency (``loss.multiview``, PGSR).

A reference camera r and a neighbour camera n (:mod:`splat.neighbour_views`)
are rendered; each reference pixel's rendered depth z and normal give a
plane, which must agree with what the neighbour sees.

**Plane of a pixel** (camera frame of r; p̃ = (u, v, 1) the pixel centre)::

    X = z K_r^-1 p̃            the rendered surface point
    n = R_r n_world / |.|      the rendered normal (facing the camera: n . X < 0)
    d = -n . X  (> 0)          the plane {Y : n . Y + d = 0}

It is computed here in PyTorch from the rasterizer's ``depth`` and ``normal``
outputs, whose gradients are exact (tested by float64 finite differences in
``tests/test_finite_differences.py``), rather than rendered as a blended
per-primitive plane distance (PGSR renders that; it would be a new kernel
output needing its own exact backward on every backend).  The two differ:
PGSR's d blends each primitive's own plane distance, ours is the plane
through the expected-depth point.

**Homography** induced by the plane, from r to n (R, t: r's camera frame to n's)::

    H_rn = K_n (R - t n^T / d) K_r^-1        (Y on the plane: n^T Y = -d, so R Y + t = (R - t n^T/d) Y)

**Geometric term** (forward-backward reprojection): p -> q = H_rn p̃ in n;
there the neighbour's own rendered surface (its depth z_n(q), bilinear) maps
q back to r, p' = H_nr(q) q with n's plane at q; since that plane passes
through n's surface point, H_nr q is the projection of that point into r::

    φ(p) = |p - p'|,   w(p) = exp(-φ) (no gradient),   valid: φ < pixel_noise, q inside n, z_n(q) > 0
    L_geo = Σ_valid w φ / #valid

**Photometric term**: the grey photo's S x S patch around p in r and the
same patch's pixels mapped by H_rn into n's grey photo (bilinear)::

    NCC = Σ (a - ā)(b - b̄) / sqrt(Σ (a - ā)² Σ (b - b̄)² + ε)
    L_ncc = Σ_kept w (1 - NCC) / #kept

kept: valid for the geometric term, the reference patch not flat (its
(population) standard deviation above ``min_patch_std``), and 1 - NCC < 0.9 (PGSR's
occlusion mask: a patch unlike its match is more likely occluded than
misplaced).  PGSR uses 1 - NCC² (sign-blind); we use 1 - NCC, so that an
inverted match is not rewarded.  Only the homography (so depth and normal)
gets the gradient of the photometric term: both patches are photos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .conventions import pixel_centers_offset

__all__ = [
    "GREY_WEIGHTS",
    "NCC_OUTLIER",
    "ViewGeometry",
    "pixel_centres",
    "camera_planes",
    "pixel_planes",
    "relative_pose",
    "plane_homography",
    "apply_homography",
    "project",
    "rays_through",
    "sample_bilinear",
    "forward_backward_error",
    "patch_offsets",
    "ncc",
    "grey",
    "multiview_losses",
]

#: Luma weights of the grey image (ITU-R BT.601, as PGSR).
GREY_WEIGHTS = (0.299, 0.587, 0.114)
#: Patches with 1 - NCC at or above this are left out (PGSR's occlusion mask).
NCC_OUTLIER = 0.9
#: Where a point behind a camera projects: outside any image.
OFF_IMAGE = -1.0e6
#: A plane seen within this cosine of edge-on (|n . ray| < 0.05, ~87°) gives no homography.
MIN_COS = 0.05


@dataclass
class ViewGeometry:
    """One camera's render as the multi-view terms read it."""

    depth: torch.Tensor  # [H, W] rendered camera z (0 = nothing)
    normal: torch.Tensor  # [H, W, 3] rendered world normal (sum w n, not unit)
    alpha: torch.Tensor  # [H, W]
    K: torch.Tensor  # [3, 3]
    viewmat: torch.Tensor  # [4, 4] world -> camera


def pixel_centres(H: int, W: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """(u, v) of every pixel centre, [H, W, 2] (column j, row i -> (j + c, i + c), c from splat.conventions)."""
    c = pixel_centers_offset()
    v, u = torch.meshgrid(
        torch.arange(H, dtype=dtype, device=device) + c,
        torch.arange(W, dtype=dtype, device=device) + c,
        indexing="ij",
    )
    return torch.stack([u, v], dim=-1)


def rays_through(pix: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """K^-1 (u, v, 1) of continuous pixels [..., 2] -> camera rays [..., 3] with z = 1."""
    x = (pix[..., 0] - K[0, 2]) / K[0, 0]
    y = (pix[..., 1] - K[1, 2]) / K[1, 1]
    return torch.stack([x, y, torch.ones_like(x)], dim=-1)


def camera_planes(
    depth: torch.Tensor, normal_world: torch.Tensor, K: torch.Tensor, viewmat: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each pixel's plane in its camera's frame (module doc).

    depth [H, W], normal_world [H, W, 3] -> (X [H, W, 3] surface points,
    n [H, W, 3] unit normals, d [H, W] plane distances ``-n . X``)."""
    H, W = depth.shape
    rays = rays_through(pixel_centres(H, W, depth.dtype, depth.device), K)  # [H, W, 3]
    return pixel_planes(depth, normal_world, rays, viewmat)


def pixel_planes(
    z: torch.Tensor, normal_world: torch.Tensor, rays: torch.Tensor, viewmat: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The planes of pixels with depths z [...], world normals [..., 3] and
    rays [..., 3] (z = 1) -> (X [..., 3], unit n [..., 3], d [...]) (module doc)."""
    X = z[..., None] * rays
    n = normal_world @ viewmat[:3, :3].T.to(normal_world.dtype)  # R n_world
    n = n / n.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return X, n, -(n * X).sum(-1)


def relative_pose(view_src: torch.Tensor, view_dst: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(R [3, 3], t [3]) taking a point from ``view_src``'s camera frame to ``view_dst``'s."""
    R = view_dst[:3, :3] @ view_src[:3, :3].T
    return R, view_dst[:3, 3] - R @ view_src[:3, 3]


def plane_homography(
    K_src: torch.Tensor, K_dst: torch.Tensor, R: torch.Tensor, t: torch.Tensor, n: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    """H = K_dst (R - t n^T / d) K_src^-1 for planes n [P, 3], d [P] -> [P, 3, 3]."""
    M = R[None] - t[None, :, None] * (n / d[:, None])[:, None, :]  # [P, 3, 3]
    return K_dst[None] @ M @ torch.linalg.inv(K_src)[None]


def apply_homography(Hm: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
    """Pixels pts [P, Q, 2] through H [P, 3, 3] -> [P, Q, 2] (divided by the
    third coordinate; a point mapped behind the destination camera, third
    coordinate <= 0, lands at :data:`OFF_IMAGE`, outside any image, with no
    gradient)."""
    h = pts @ Hm[:, :, :2].transpose(1, 2) + Hm[:, None, :, 2]  # [P, Q, 3] = H (u, v, 1)
    return _dehomogenise(h[..., :2], h[..., 2])


def _dehomogenise(xy: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """xy [..., 2] / z [...], :data:`OFF_IMAGE` where z <= 0 (no inf or NaN in the graph)."""
    front = z > 1e-9
    q = xy / torch.where(front, z, torch.ones_like(z))[..., None]
    return torch.where(front[..., None], q, torch.full_like(q, OFF_IMAGE))


def project(X: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Camera-frame points [..., 3] -> pixels [..., 2] (:data:`OFF_IMAGE` for points at or behind the camera)."""
    uv = torch.stack([K[0, 0] * X[..., 0] + K[0, 2] * X[..., 2], K[1, 1] * X[..., 1] + K[1, 2] * X[..., 2]], dim=-1)
    return _dehomogenise(uv, X[..., 2])


def sample_bilinear(img: torch.Tensor, pts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """img [H, W, C] at continuous pixels pts [..., 2] (bilinear, differentiable in
    both) -> (values [..., C], inside [...] : every tap inside the image)."""
    H, W, C = img.shape
    g = torch.stack([2 * pts[..., 0] / W - 1, 2 * pts[..., 1] / H - 1], dim=-1).reshape(1, -1, 1, 2)
    vals = F.grid_sample(img.permute(2, 0, 1)[None], g.to(img.dtype), align_corners=False, padding_mode="zeros")
    inside = (pts[..., 0] >= 0.5) & (pts[..., 0] <= W - 0.5) & (pts[..., 1] >= 0.5) & (pts[..., 1] <= H - 0.5)
    return vals[0, :, :, 0].T.reshape(*pts.shape[:-1], C), inside


def forward_backward_error(
    X_ref: torch.Tensor,  # [P, 3] reference surface points (reference camera frame)
    pix: torch.Tensor,  # [P, 2] their pixels in the reference camera
    K_ref: torch.Tensor,
    K_nb: torch.Tensor,
    R: torch.Tensor,  # [3, 3] reference frame -> neighbour frame
    t: torch.Tensor,  # [3]
    depth_nb: torch.Tensor,  # [h, w] the neighbour's rendered depth
    nb_size: Optional[Tuple[int, int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(φ [P] the forward-backward pixel error, valid [P]) (module doc).

    q = the projection of X_ref into the neighbour (= H_rn p̃ for the plane
    through X_ref); the neighbour's surface point there, taken back to the
    reference frame and projected, gives p'.  ``nb_size`` (H, W): the image
    ``K_nb`` is the intrinsics of, when ``depth_nb`` is rendered at an
    integer fraction of it (``loss.multiview.neighbour_downscale``): q is
    looked up at q (w / W, h / H), exact with pixel centres at j + 0.5."""
    Xn = X_ref @ R.T + t  # [P, 3]
    q = project(Xn, K_nb)  # [P, 2]
    h, w = depth_nb.shape
    H, W = nb_size if nb_size is not None else (h, w)
    q_depth = q if (h, w) == (H, W) else q * torch.tensor([w / W, h / H], dtype=q.dtype, device=q.device)
    z_nb, inside = sample_bilinear(depth_nb[..., None], q_depth)
    z_nb = z_nb[:, 0]
    Y = z_nb[:, None] * rays_through(q, K_nb)  # [P, 3] the neighbour's surface point (its frame)
    Y_ref = (Y - t) @ R  # R^T (Y - t)
    valid = inside & (Xn[:, 2] > 0) & (z_nb > 0) & (Y_ref[:, 2] > 0)
    safe = torch.where(valid[:, None], Y_ref, torch.ones_like(Y_ref))  # no 0/0 in the graph
    return (project(safe, K_ref) - pix).norm(dim=-1) * valid, valid


def patch_offsets(size: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Integer offsets of a size x size patch around its centre, [size², 2] (u, v)."""
    h = size // 2
    r = torch.arange(-h, h + 1, dtype=dtype, device=device)
    dv, du = torch.meshgrid(r, r, indexing="ij")
    return torch.stack([du.reshape(-1), dv.reshape(-1)], dim=-1)


def ncc(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Normalised cross-correlation of patches a, b [P, Q] -> [P] in [-1, 1]."""
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    return (a * b).sum(1) / torch.sqrt((a * a).sum(1) * (b * b).sum(1) + eps)


def grey(rgb: torch.Tensor) -> torch.Tensor:
    """[H, W, 3] -> [H, W, 1] luma (:data:`GREY_WEIGHTS`)."""
    w = torch.tensor(GREY_WEIGHTS, dtype=rgb.dtype, device=rgb.device)
    return (rgb * w).sum(-1, keepdim=True)


def multiview_losses(
    ref: ViewGeometry,
    nb: ViewGeometry,
    grey_ref: torch.Tensor,  # [H, W, 1] the reference photo, grey
    grey_nb: torch.Tensor,  # [H', W', 1] the neighbour photo, grey
    order: torch.Tensor,  # [S] flat pixel indices (row-major), the pixels' preference order
    num_pixels: int = 4096,
    patch_size: int = 7,
    pixel_noise: float = 1.0,
    min_patch_std: float = 0.01,
    min_alpha: float = 0.5,
    weights: Optional[torch.Tensor] = None,
    geo_pixels: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """(L_geo, L_ncc, counts) of the module doc for one (reference, neighbour) pair.

    The geometric term covers every reference pixel with ``alpha >
    min_alpha`` (``geo_pixels`` > 0: the first that many of them in
    ``order``, an unbiased estimate of the same mean when ``order`` is a
    random permutation); the photometric term the first ``num_pixels``
    pixels of ``order`` (a random permutation in training: PGSR's sampling)
    that are valid for the geometric term, not seen edge-on and whose patch
    lies inside the image.  ``nb.K`` is the intrinsics of the neighbour's
    photo ``grey_nb``; ``nb.depth`` may be rendered at an integer fraction of
    its size (:func:`forward_backward_error`).  Either loss is a zero (with a
    graph) when no pixel qualifies.  The third item: the pixel counts of
    either term and ``weights`` [H W], the weights w (zero outside the
    geometric mask); passing them back as ``weights`` holds w fixed (w has
    no gradient, so finite differences of the losses see w as a constant
    only then)."""
    H, W = ref.depth.shape
    dev = ref.depth.device
    R, t = relative_pose(ref.viewmat, nb.viewmat)
    covered = ((ref.alpha > min_alpha) & (ref.depth > 0)).reshape(-1)
    pix = pixel_centres(H, W, ref.depth.dtype, dev).reshape(-1, 2)  # [HW, 2]
    z = ref.depth.reshape(-1)  # [HW]
    if geo_pixels > 0:  # the geometric term's pixels `at`: gathered (P < HW)
        at = order[covered[order]][:geo_pixels]  # [P]
        pix, z, covered = pix[at], z[at], covered[at]
    else:  # every pixel: the same maths without the gathers (cheaper than them)
        at = torch.arange(H * W, device=dev)
    rays = rays_through(pix, ref.K)  # [P, 3]
    X = z[:, None] * rays  # [P, 3] the surface points (module doc)
    err, valid = forward_backward_error(X, pix, ref.K, nb.K, R, t, nb.depth, tuple(grey_nb.shape[:2]))
    keep = (valid & covered & (err < pixel_noise)).detach()
    if weights is None:
        w_at = torch.exp(-err).detach() * keep
        w = w_at if geo_pixels <= 0 else torch.zeros(H * W, dtype=w_at.dtype, device=dev).index_copy_(0, at, w_at)
    else:
        w, w_at = weights, (weights if geo_pixels <= 0 else weights[at])
    n_geo = int(keep.sum())
    geo = (w_at * err).sum() / max(n_geo, 1)

    # Photometric term: the first num_pixels of `order` whose patch is inside
    # the image, valid for the geometric term and not seen edge-on; each
    # pixel's plane (module doc) only where it is a candidate.
    h = patch_size // 2
    u, v = pix[:, 0] - 0.5, pix[:, 1] - 0.5  # column, row
    cand = (keep & (v >= h) & (v < H - h) & (u >= h) & (u < W - h)).nonzero().reshape(-1)  # into `at`
    _, n, d = pixel_planes(z[cand], ref.normal.reshape(-1, 3)[at[cand]], rays[cand], ref.viewmat)  # [C, 3], [C]
    cos = (n * rays[cand]).sum(-1).abs() / rays[cand].norm(dim=-1)
    eligible = torch.zeros(H * W, dtype=torch.bool, device=dev)
    eligible[at[cand[(cos > MIN_COS).detach()]]] = True
    sample = order[eligible[order]][:num_pixels]  # [S] pixel indices
    slot = torch.full((H * W,), -1, dtype=torch.long, device=dev)
    slot[at[cand]] = torch.arange(cand.numel(), device=dev)
    which = slot[sample]  # [S] their rows of n, d
    offs = patch_offsets(patch_size, torch.long, dev)  # [Q, 2]
    rows = (sample // W)[:, None] + offs[None, :, 1]  # [S, Q]
    cols = (sample % W)[:, None] + offs[None, :, 0]
    a = grey_ref[rows, cols, 0]  # [S, Q] exact pixel values: the offsets are whole pixels
    Hm = plane_homography(ref.K, nb.K, R, t, n[which], d[which])
    q = apply_homography(Hm, pix[cand[which]][:, None, :] + offs[None].to(pix.dtype))  # [S, Q, 2]
    b, inside = sample_bilinear(grey_nb, q)
    corr = ncc(a.to(b.dtype), b[..., 0])
    flat = (a - a.mean(dim=1, keepdim=True)).square().mean(dim=1).sqrt() <= min_patch_std
    kept = (inside.all(dim=1) & ~flat & (1 - corr < NCC_OUTLIER)).detach()
    n_ncc = int(kept.sum())
    photo = torch.where(kept, w[sample] * (1 - corr), torch.zeros_like(corr)).sum() / max(n_ncc, 1)
    return geo, photo, {"geo_pixels": n_geo, "ncc_patches": n_ncc, "weights": w}
