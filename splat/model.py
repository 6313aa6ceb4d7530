"""Gaussian model (surfels or 3D Gaussians): raw parameters, activations, initialisation.

The model stores *raw* (unconstrained) parameters, optimised by Adam, and
exposes the *activated* values that :func:`splat.rasterize` (surfels, two
scales) or :func:`splat.rasterize_3dgs` (3D Gaussians, three scales)
expects; the number of scales is the primitive (:attr:`GaussianModel.primitive`):

=================  ===============  ===================================  =====================
parameter          shape            activation                           rasterize argument
=================  ===============  ===================================  =====================
``means``          [N, 3]           identity                             ``means``
``quats``          [N, 4] (w,x,y,z) identity (rasterize normalises)      ``quats``
``scales``         [N, 2] or [N, 3] ``exp`` (stored as log std devs)     ``scales``
``opacities``      [N]              ``sigmoid`` (stored as logits)       ``opacities``
``sh0``            [N, 1, 3]        SH DC coefficient                    ``colors[:, :1]``
``shN``            [N, K-1, 3]      higher SH bands, K = (d_max+1)^2     ``colors[:, 1:]``
=================  ===============  ===================================  =====================

Colour follows the 3DGS convention: ``rgb = max(SH(dir) + 0.5, 0)`` with
``SH_0 = C0 * sh0``, so a DC coefficient ``(rgb - 0.5) / C0`` reproduces ``rgb``.

A surfel's two tangent axes are the first two columns of its rotation matrix,
and its normal is the third column (2DGS).

PLY files: :mod:`splat.ply`.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .geometry import knn_mean_distance, quat_to_rotmat
from .sh import num_sh_bases, rgb_to_sh

#: Primitives and their number of scales.
PRIMITIVE_SCALES = {"2dgs": 2, "3dgs": 3}
#: Names of the raw parameters, in a fixed order (checkpoints, optimisers, PLY).
PARAM_NAMES = ("means", "quats", "scales", "opacities", "sh0", "shN")


def logit(p: torch.Tensor) -> torch.Tensor:
    """Inverse of sigmoid, clamped away from 0 and 1 to stay finite."""
    p = p.clamp(1e-6, 1.0 - 1e-6)
    return torch.log(p / (1.0 - p))


class GaussianModel(nn.Module):
    """The trainable surfels: a :class:`torch.nn.ParameterDict` of raw tensors.

    Densification replaces whole parameters (``model.params[name] = new``), so
    code must look parameters up by name each step rather than hold on to them.

    ``ids`` [N] int64: each surfel's identity, unique in the run and never
    reused (default ``0 .. N-1``); ``next_id``: the identity the next new
    surfel gets (default ``max(ids) + 1``).  Densification keeps the rows in
    increasing id order on one process, and keys its randomness by id, so a
    surfel's fate does not depend on which process holds it.
    """

    def __init__(
        self,
        params: Dict[str, torch.Tensor],
        sh_degree: int,
        ids: Optional[torch.Tensor] = None,
        next_id: Optional[int] = None,
    ):
        super().__init__()
        self.sh_degree = int(sh_degree)  # maximum SH degree (size of shN)
        expected_rest = num_sh_bases(self.sh_degree) - 1
        if params["shN"].shape[1] != expected_rest:
            raise ValueError(f"shN has {params['shN'].shape[1]} coefficients, degree {sh_degree} needs {expected_rest}")
        self.params = nn.ParameterDict({k: nn.Parameter(params[k].detach().float().contiguous()) for k in PARAM_NAMES})
        n = self.num_gaussians
        self.ids = torch.arange(n, dtype=torch.int64) if ids is None else ids.detach().to(torch.int64).cpu()
        if self.ids.shape != (n,):
            raise ValueError(f"ids has shape {tuple(self.ids.shape)}, expected ({n},)")
        self.next_id = int(next_id) if next_id is not None else (int(self.ids.max()) + 1 if n else 0)

    # ----------------------------------------------------------- activations
    @property
    def num_gaussians(self) -> int:
        return int(self.params["means"].shape[0])

    @property
    def means(self) -> torch.Tensor:  # [N, 3]
        return self.params["means"]

    @property
    def quats(self) -> torch.Tensor:  # [N, 4]
        return self.params["quats"]

    @property
    def primitive(self) -> str:
        """ "2dgs" (surfels: two scales) or "3dgs" (3D Gaussians: three)."""
        return "3dgs" if self.params["scales"].shape[1] == 3 else "2dgs"

    # The activations run in float64 and round to the parameters' dtype.  On
    # the CPU, torch evaluates exp and sigmoid with SIMD code and the last few
    # elements of a tensor with scalar code, which round differently in the
    # last bit, so in float32 a surfel's value would depend on where its row
    # falls in the tensor, and a model split over processes would
    # drift from one process.  Rounded from float64, both agree (but with
    # odds of ~1e-9 per value).

    @property
    def scales(self) -> torch.Tensor:  # [N, 2] or [N, 3] std devs (> 0)
        raw = self.params["scales"]
        return torch.exp(raw.double()).to(raw.dtype)

    @property
    def opacities(self) -> torch.Tensor:  # [N] in (0, 1)
        raw = self.params["opacities"]
        return torch.sigmoid(raw.double()).to(raw.dtype)

    def colors(self, degree: Optional[int] = None) -> torch.Tensor:
        """SH coefficients up to ``degree`` (default: the max): [N, (degree+1)^2, 3]."""
        d = self.sh_degree if degree is None else min(int(degree), self.sh_degree)
        rest = self.params["shN"][:, : num_sh_bases(d) - 1]  # [N, K_d - 1, 3]
        return torch.cat([self.params["sh0"], rest], dim=1)

    def normals(self) -> torch.Tensor:
        """World-space normals [N, 3]: a surfel's third rotation column, a 3D
        Gaussian's shortest axis."""
        rot = quat_to_rotmat(self.params["quats"])  # [N, 3, 3]
        if self.primitive == "2dgs":
            return rot[..., 2]
        shortest = self.params["scales"].argmin(dim=1)  # [N]
        return rot.gather(2, shortest[:, None, None].expand(-1, 3, 1))[..., 0]

    # ------------------------------------------------------------ state I/O
    def raw_state(self) -> Dict[str, torch.Tensor]:
        """Detached copies of the raw parameters (for checkpoints)."""
        return {k: v.detach().clone() for k, v in self.params.items()}

    @classmethod
    def from_raw_state(cls, state: Dict[str, torch.Tensor], sh_degree: int) -> GaussianModel:
        return cls(state, sh_degree)


# ----------------------------------------------------------------- creation
def random_quats(n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Uniformly random unit quaternions (w, x, y, z). [n, 4]"""
    q = torch.randn(n, 4, generator=generator)
    return q / q.norm(dim=1, keepdim=True).clamp_min(1e-12)


def create_from_points(
    points: torch.Tensor,  # [M, 3]
    colors: torch.Tensor,  # [M, 3] in [0, 1]
    sh_degree: int = 3,
    init_opacity: float = 0.1,
    init_scale: float = 1.0,
    generator: Optional[torch.Generator] = None,
    max_scales: Optional[torch.Tensor] = None,  # [M]
    primitive: str = "2dgs",
) -> GaussianModel:
    """Surfels (or, ``primitive="3dgs"``, 3D Gaussians) centred on
    ``points``: colour -> SH DC, random orientation, and isotropic scale =
    ``init_scale`` x mean distance to the 3 nearest neighbours (the 3DGS
    rule, so neighbours just touch), at most ``max_scales`` (world units,
    per point; see :func:`splat.data.initial_points.pixel_footprint`): an
    isolated point of a sparse cloud would otherwise start as a disc over
    much of the image."""
    if primitive not in PRIMITIVE_SCALES:
        raise ValueError(f"primitive must be one of {list(PRIMITIVE_SCALES)}, got {primitive!r}")
    points = points.float()
    n = points.shape[0]
    dist = knn_mean_distance(points, k=3).clamp_min(1e-7) * init_scale  # [N]
    if max_scales is not None:
        dist = torch.minimum(dist, max_scales.to(dist)).clamp_min(1e-7)
    log_s = torch.log(dist)[:, None].repeat(1, PRIMITIVE_SCALES[primitive])  # [N, 2 or 3]
    sh0 = rgb_to_sh(colors.float().clamp(0, 1))[:, None, :]  # [N, 1, 3]
    shN = torch.zeros(n, num_sh_bases(sh_degree) - 1, 3)  # [N, K-1, 3]
    params = {
        "means": points.clone(),
        "quats": random_quats(n, generator),
        "scales": log_s,
        "opacities": logit(torch.full((n,), float(init_opacity))),
        "sh0": sh0,
        "shN": shN,
    }
    return GaussianModel(params, sh_degree)
