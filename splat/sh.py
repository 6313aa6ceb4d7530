"""Real spherical harmonics up to degree 3 (the 3DGS basis and ordering).

Colour follows the 3DGS convention: ``rgb = max(SH(dir) + 0.5, 0)``, so the
degree-0 term alone is ``C0 * sh0 + 0.5`` (:func:`sh_to_rgb`).
"""

from __future__ import annotations

import torch

#: Real spherical-harmonic constant of degree 0: Y_0^0 = 1 / (2 sqrt(pi)).
C0 = 0.28209479177387814
C1 = 0.4886025119029199
C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
C3 = (
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
)
MAX_SH_DEGREE = 3


def num_sh_bases(degree: int) -> int:
    """Number of SH coefficients per colour channel for ``degree``: (d+1)^2."""
    return (degree + 1) ** 2


def sh_basis(degree: int, dirs: torch.Tensor) -> torch.Tensor:
    """Evaluates the basis for unit directions ``dirs`` [N, 3]; returns [N, (degree+1)^2]."""
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"sh_degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, C0)]
    if degree >= 1:
        out += [-C1 * y, C1 * z, -C1 * x]
    if degree >= 2:
        xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
        out += [C2[0] * xy, C2[1] * yz, C2[2] * (2 * zz - xx - yy), C2[3] * xz, C2[4] * (xx - yy)]
    if degree >= 3:
        out += [
            C3[0] * y * (3 * xx - yy),
            C3[1] * xy * z,
            C3[2] * y * (4 * zz - xx - yy),
            C3[3] * z * (2 * zz - 3 * xx - 3 * yy),
            C3[4] * x * (4 * zz - xx - yy),
            C3[5] * z * (xx - yy),
            C3[6] * x * (xx - 3 * yy),
        ]
    return torch.stack(out, dim=-1)


def eval_sh(degree: int, coeffs: torch.Tensor, dirs: torch.Tensor) -> torch.Tensor:
    """Colour from SH coefficients ``coeffs`` [N, K >= (degree+1)^2, 3] along unit ``dirs`` [N, 3].

    Only the first (degree+1)^2 coefficients are used, so a model can raise its
    active degree on a schedule without reallocating.  Returns [N, 3].
    """
    basis = sh_basis(degree, dirs)  # [N, B]
    return (basis.unsqueeze(-1) * coeffs[:, : basis.shape[-1]]).sum(dim=1)


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """The degree-0 coefficient that renders as ``rgb`` (inverse of :func:`sh_to_rgb`)."""
    return (rgb - 0.5) / C0


def sh_to_rgb(sh: torch.Tensor) -> torch.Tensor:
    """Colour of a degree-0 coefficient: ``C0 * sh + 0.5``."""
    return sh * C0 + 0.5
