"""The maths of 3DGS-MCMC's moves (Kheradmand et al. 2024): the opacity and
scale a primitive gets when it is shared by ``n`` copies of itself, the
keyed draw proportional to opacity, and the position noise.

**Relocation.**  A primitive of opacity ``o`` and scales ``s`` replaced by
``n`` copies at its centre, each of opacity ``o'`` and scales ``c s``, should
render as it did.  At the centre the ``n`` copies composite to
``1 - (1 - o')^n``, equal to ``o`` for

    o' = 1 - (1 - o)^(1/n).

Along any line through the centre, with ``g(x) = exp(-x^2 / 2)`` in units of
the scale, copy ``i`` (front to back) adds ``a (1 - a)^(i-1)`` with
``a = o' g(x / c s)``; expanding ``(1 - a)^(i-1)`` binomially and integrating
``g^(k+1)`` (which gives ``sqrt(2 pi) c s / sqrt(k+1)``), the line integral
of the composite equals the original's ``o sqrt(2 pi) s`` for

    c = o / sum_{i=1..n} sum_{k=0..i-1} C(i-1, k) (-1)^k o'^(k+1) / sqrt(k+1),

the paper's formula (gsplat's ``compute_relocation``), with ``n`` at most
:data:`MAX_COPIES`.  Every scale is multiplied by ``c``: a 3D Gaussian's
three, a surfel's two tangent scales.

**Noise.**  After every optimiser step each mean moves by

    Sigma (z sigmoid(-k (o - t))) lr_means noise_lr,   z ~ N(0, I_3),

``Sigma = R diag(s^2) R^T`` the primitive's covariance (gsplat multiplies by
the covariance, not its square root), ``k`` = :data:`NOISE_SHARPNESS`, ``t``
= :data:`NOISE_THRESHOLD`: opaque primitives stay, nearly transparent ones
explore.  A surfel's covariance is that of its 2D Gaussian,
``R diag(s_u^2, s_v^2, 0) R^T``: zero along its normal, so the noise slides
it in its own plane and never lifts it off the surface it lies on.

Everything is evaluated in float64 and rounded to the parameters' dtype, row
by row, so that a primitive gets the same bits wherever its row sits (one
process or several, see :mod:`splat.model`).
"""

from __future__ import annotations

import math

import torch

from ..geometry import quat_to_rotmat
from ..keyed_random import keyed_normal, keyed_uniform

__all__ = [
    "MAX_COPIES",
    "NOISE_SHARPNESS",
    "NOISE_THRESHOLD",
    "NOISE_CUTOFF",
    "binomial_table",
    "relocated_opacity_scale",
    "keyed_draw",
    "noise_factor",
    "position_noise",
]

#: The largest number of copies the scale formula sums over (gsplat's n_max).
MAX_COPIES = 51
#: k of the noise gate sigmoid(-k (o - t)) (gsplat).
NOISE_SHARPNESS = 100.0
#: t of the noise gate: primitives more opaque than this barely move (gsplat).
NOISE_THRESHOLD = 0.005
#: Gates below this give no noise at all (opacity above 0.28; see position_noise).
NOISE_CUTOFF = 1e-12


def binomial_table(n_max: int = MAX_COPIES) -> torch.Tensor:  # [n_max, n_max] float64
    """``C(n, k)`` at ``[n, k]`` for 0 <= k <= n < ``n_max`` (0 above the diagonal)."""
    return torch.tensor([[math.comb(n, k) for k in range(n_max)] for n in range(n_max)], dtype=torch.float64)


def relocated_opacity_scale(opacities: torch.Tensor, scales: torch.Tensor, copies: torch.Tensor):
    """The opacity and scales of each of ``copies`` [M] primitives that share
    one of opacity ``opacities`` [M] and scales ``scales`` [M, D] (module
    doc); ``copies`` is clamped to [1, :data:`MAX_COPIES`].  Returns
    (opacities [M], scales [M, D]) in float64."""
    o = opacities.double()
    n = copies.clamp(1, MAX_COPIES).to(torch.int64)
    new_o = 1.0 - torch.pow(1.0 - o, 1.0 / n.double())  # [M]
    binoms = binomial_table().to(o.device)  # [51, 51]
    k = torch.arange(MAX_COPIES, dtype=torch.float64, device=o.device)  # [K]
    # term[m, k] = (-1)^k o'^(k+1) / sqrt(k+1); sum over i <= n of C(i-1, k)
    # = C(n, k+1) (hockey stick), so the double sum is a single one.
    sign = torch.where(k.remainder(2) == 0, 1.0, -1.0)
    terms = sign * new_o[:, None] ** (k + 1) / torch.sqrt(k + 1)  # [M, K]
    weights = _hockey_stick(binoms, n)  # [M, K]
    denom = (weights * terms).sum(dim=-1)  # [M]
    return new_o, scales.double() * (o / denom)[:, None]


def _hockey_stick(binoms: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``sum_{i=1..n} C(i-1, k)`` [M, K] for each row's ``n`` [M]: the
    cumulative sum of the table's rows, read at row n-1."""
    return torch.cumsum(binoms, dim=0)[n - 1]


def keyed_draw(weights: torch.Tensor, count: int, seed: int, stream: int, key) -> torch.Tensor:  # [count] int64
    """``count`` indices into ``weights`` [M] (>= 0, float64, not all 0),
    drawn with replacement in proportion to them, by inverse CDF sampling of
    uniforms keyed by (``key``..., draw): the same draws for the same
    weights in the same order, however they were computed."""
    cdf = torch.cumsum(weights.double().cpu(), dim=0)  # [M]
    keys = torch.tensor([[*key, j] for j in range(count)], dtype=torch.int64).reshape(count, len(key) + 1)
    u = keyed_uniform(seed, stream, keys, 1)[:, 0] * float(cdf[-1])  # [count]
    return torch.searchsorted(cdf, u, right=True).clamp_max(len(cdf) - 1)


def noise_factor(opacities: torch.Tensor) -> torch.Tensor:  # [N] float64
    """The noise gate ``sigmoid(-k (o - t))`` of opacities [N] (module doc)."""
    return torch.sigmoid(-NOISE_SHARPNESS * (opacities.double() - NOISE_THRESHOLD))


def position_noise(
    quats: torch.Tensor,  # [N, 4]
    scales: torch.Tensor,  # [N, 2] surfels, [N, 3] 3D Gaussians
    opacities: torch.Tensor,  # [N]
    ids: torch.Tensor,  # [N] int64
    step: int,
    scaler: float,
    seed: int,
    stream: int,
) -> torch.Tensor:  # [N, 3] float64
    """The MCMC displacement of each mean (module doc): ``Sigma (z gate) scaler``
    with ``z`` keyed by (``step``, id); ``scaler`` = lr_means x noise_lr.
    Rows whose gate is below :data:`NOISE_CUTOFF` (opacity above 0.28) get
    exactly 0: their displacement would be under 1e-12 of a transparent
    primitive's of the same shape, and skipping them saves most of the cost."""
    n = ids.shape[0]
    gate = noise_factor(opacities.detach())  # [N]
    out = torch.zeros(n, 3, dtype=torch.float64, device=quats.device)
    rows = (gate >= NOISE_CUTOFF).nonzero(as_tuple=True)[0]
    if rows.numel() == 0:
        return out
    ids = ids.cpu()[rows.cpu()]
    keys = torch.stack([torch.full_like(ids, int(step)), ids], dim=1)  # [M, 2]
    z = keyed_normal(seed, stream, keys, 3).to(quats.device)  # [M, 3] float64
    z = z * (gate[rows] * float(scaler))[:, None]
    R = quat_to_rotmat(quats.detach()[rows].double())  # [M, 3, 3]
    var = scales.detach()[rows].double() ** 2  # [M, D]
    if var.shape[1] == 2:  # a surfel: no extent along its normal (column 2 of R)
        var = torch.cat([var, var.new_zeros(len(rows), 1)], dim=1)
    # Sigma z = R (var * (R^T z)), written as sums of products: the same bits for
    # a row wherever it sits (no batched matrix product).
    local = R[:, 0, :] * z[:, 0:1] + R[:, 1, :] * z[:, 1:2] + R[:, 2, :] * z[:, 2:3]  # [M, 3] = R^T z
    local = local * var
    out[rows] = R[:, :, 0] * local[:, 0:1] + R[:, :, 1] * local[:, 1:2] + R[:, :, 2] * local[:, 2:3]
    return out
