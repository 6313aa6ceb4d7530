"""Gaussian model (surfels or 3D Gaussians): raw parameters, activations, initialisation, PLY I/O.

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

PLY files use the INRIA 3DGS attribute names so that common viewers open them:
``x y z nx ny nz f_dc_0..2 f_rest_0.. opacity scale_0 scale_1 scale_2 rot_0..3``
with logit opacity, log scales and ``f_rest`` in INRIA's channel-major order
(all red coefficients, then green, then blue).  A surfel is flat, but 3D-Gaussian
viewers need three scales: ``scale_2`` (the normal axis) is written as
``log(PLY_THIN_FACTOR * min(s0, s1))``, i.e. 1% of the smaller tangent scale.
A relative thickness (rather than a fixed tiny constant such as 1e-7) keeps
the disc look while keeping the squared scales far from float16 underflow in
viewers that pack covariances as half floats.  ``scale_2`` is ignored on load,
so a save/load round trip is lossless.  ``nx ny nz`` hold the surfel normal
(3DGS viewers ignore them).  A 3D Gaussian writes its three scales, as
INRIA's 3DGS does, and ``nx ny nz`` hold its shortest axis.

The file says which primitive it holds in a header comment
(``comment splat primitive 2dgs`` or ``3dgs``).  A file without one is read
as surfels when it has two scales (2DGS's files) or when ``scale_2`` is the
thin axis above (splat's files before the comment), else as 3D Gaussians
(INRIA 3DGS and the viewers and tools that follow it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from .conventions import pixel_centers_offset
from .errors import SplatInputError

#: Real spherical-harmonic constant of degree 0: Y_0^0 = 1 / (2 sqrt(pi)).
SH_C0 = 0.28209479177387814
#: Thickness of the normal axis written to PLY, relative to the smaller tangent scale.
PLY_THIN_FACTOR = 1e-2
#: PLY header comment naming the primitive ("splat primitive 2dgs" / "... 3dgs").
PLY_PRIMITIVE_COMMENT = "splat primitive"
#: Primitives and their number of scales.
PRIMITIVE_SCALES = {"2dgs": 2, "3dgs": 3}
#: Names of the raw parameters, in a fixed order (checkpoints, optimisers, PLY).
PARAM_NAMES = ("means", "quats", "scales", "opacities", "sh0", "shN")


def num_sh_bases(degree: int) -> int:
    """Number of SH coefficients per colour channel for ``degree``: (d+1)^2."""
    return (degree + 1) ** 2


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """DC SH coefficient that renders as ``rgb`` (inverse of ``SH_C0*c + 0.5``)."""
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(sh: torch.Tensor) -> torch.Tensor:
    """Colour of a DC SH coefficient."""
    return sh * SH_C0 + 0.5


def logit(p: torch.Tensor) -> torch.Tensor:
    """Inverse of sigmoid, clamped away from 0 and 1 to stay finite."""
    p = p.clamp(1e-6, 1.0 - 1e-6)
    return torch.log(p / (1.0 - p))


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from (w, x, y, z) quaternions (normalised here).

    quats: [N, 4] -> [N, 3, 3]; column 2 is the surfel normal.
    """
    q = quats / quats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    w, x, y, z = q.unbind(-1)
    R = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    )
    return R.reshape(q.shape[:-1] + (3, 3))


class GaussianModel(nn.Module):
    """The trainable surfels: a :class:`torch.nn.ParameterDict` of raw tensors.

    Densification replaces whole parameters (``model.params[name] = new``), so
    code must look parameters up by name each step rather than hold on to them.

    ``ids`` [N] int64: each surfel's identity, unique in the run and never
    reused (default ``0 .. N-1``); ``next_id``: the identity the next new
    surfel gets (default ``max(ids) + 1``).  Densification keeps the rows in
    increasing id order on one process, and keys its randomness by id, so a
    surfel's fate does not depend on which process holds it (issue 23).
    """

    def __init__(self, params: Dict[str, torch.Tensor], sh_degree: int, ids: Optional[torch.Tensor] = None,
                 next_id: Optional[int] = None):
        super().__init__()
        self.sh_degree = int(sh_degree)  # maximum SH degree (size of shN)
        expected_rest = num_sh_bases(self.sh_degree) - 1
        if params["shN"].shape[1] != expected_rest:
            raise ValueError(
                f"shN has {params['shN'].shape[1]} coefficients, degree {sh_degree} needs {expected_rest}"
            )
        self.params = nn.ParameterDict(
            {k: nn.Parameter(params[k].detach().float().contiguous()) for k in PARAM_NAMES}
        )
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
        """"2dgs" (surfels: two scales) or "3dgs" (3D Gaussians: three)."""
        return "3dgs" if self.params["scales"].shape[1] == 3 else "2dgs"

    # The activations run in float64 and round to the parameters' dtype.  On
    # the CPU, torch evaluates exp and sigmoid with SIMD code and the last few
    # elements of a tensor with scalar code, which round differently in the
    # last bit, so in float32 a surfel's value would depend on where its row
    # falls in the tensor, and a model split over processes (issue 23) would
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
    def from_raw_state(cls, state: Dict[str, torch.Tensor], sh_degree: int) -> "GaussianModel":
        return cls(state, sh_degree)

    # --------------------------------------------------------------- PLY I/O
    def save_ply(self, path) -> None:
        save_ply(self, path)


# ----------------------------------------------------------------- creation
def knn_mean_distance(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Mean distance from each point to its ``k`` nearest other points.

    points: [M, 3] -> [M].  A k-d tree (scipy's cKDTree, exact distances in
    float64): O(M log M), so a 500k-point SfM cloud takes seconds, where
    all-pairs distances take tens of minutes.
    """
    from scipy.spatial import cKDTree

    M = points.shape[0]
    if M <= 1:
        return torch.ones(M, dtype=points.dtype)
    k = min(k, M - 1)
    pts = points.detach().cpu().double().numpy()
    # k+1 nearest include the point itself (distance 0), dropped.  Duplicate
    # points are each other's neighbours at distance 0, as before.
    dist, _ = cKDTree(pts).query(pts, k=k + 1)
    return torch.from_numpy(dist[:, 1:].mean(axis=1)).to(points.dtype)


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


def project_points(points: torch.Tensor, viewmats: torch.Tensor, Ks: torch.Tensor):
    """Pixel coordinates [C, M, 2] (conventions.py: pixel (i, j) covers
    [j, j+1) x [i, i+1)) and camera depths [C, M] of world points [M, 3] in
    cameras ``viewmats`` [C, 4, 4] (world -> camera) with intrinsics ``Ks`` [C, 3, 3]."""
    cam = torch.einsum("cij,mj->cmi", viewmats[:, :3, :3], points) + viewmats[:, None, :3, 3]
    z = cam[..., 2]
    uv = torch.einsum("cij,cmj->cmi", Ks, cam)
    return uv[..., :2] / z.clamp_min(1e-9)[..., None], z


def pixel_rays(K: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Camera-space rays with z = 1 through every pixel centre (conventions.py:
    pixel (i, j) has its centre at (j + 0.5, i + 0.5)), row-major: ray
    ``i * width + j``; ``ray * z`` is the point at camera depth z.  [H*W, 3]"""
    c = pixel_centers_offset()
    i, j = torch.meshgrid(torch.arange(height, dtype=K.dtype) + c, torch.arange(width, dtype=K.dtype) + c,
                          indexing="ij")
    uv1 = torch.stack([j, i, torch.ones_like(i)], -1).view(-1, 3)
    return uv1 @ torch.linalg.inv(K).T


def camera_to_world(viewmat: torch.Tensor, cam: torch.Tensor) -> torch.Tensor:
    """World points [M, 3] of camera-space points ``cam`` [M, 3] of the camera
    ``viewmat`` [4, 4] (world -> camera): ``R^T (cam - t)``."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    return (cam - t) @ R


def in_image(uv: torch.Tensor, z: torch.Tensor, widths, heights) -> torch.Tensor:
    """bool, shaped as ``z``: the projection ``uv`` [..., 2] (pixels) at camera
    depth ``z`` is in front of the camera and inside the image [0, W) x [0, H)
    (``widths``/``heights``: ints, or tensors broadcasting against ``z``)."""
    return (z > 1e-6) & (uv[..., 0] >= 0) & (uv[..., 0] < widths) & (uv[..., 1] >= 0) & (uv[..., 1] < heights)


def seen_by(points: torch.Tensor, viewmats: torch.Tensor, Ks: torch.Tensor, widths, heights) -> torch.Tensor:
    """[C, M] bool: point m is in front of camera c and inside its image
    (``widths``/``heights``: ints, or [C, 1] tensors for cameras of different sizes)."""
    # One camera at a time, into one preallocated result: the projections of
    # many points in all views at once are [C, M, 3] temporaries (0.5 GB for
    # 200k points in 60 views), and chunks of them fragment glibc's heap
    # (resident memory grew by 10 MB a chunk).  Per camera they are [M, 3].
    C, M = viewmats.shape[0], points.shape[0]
    out = torch.empty(C, M, dtype=torch.bool, device=points.device)
    w = torch.as_tensor(widths).reshape(-1).expand(C) if torch.is_tensor(widths) else [widths] * C
    h = torch.as_tensor(heights).reshape(-1).expand(C) if torch.is_tensor(heights) else [heights] * C
    for c in range(C):
        uv, z = project_points(points, viewmats[c:c + 1], Ks[c:c + 1])
        out[c] = in_image(uv[0], z[0], w[c], h[c])
    return out


def uniform_in_ball(n: int, center: torch.Tensor, radius: float,
                    generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``n`` points uniform in the ball (``center`` [3], ``radius``): a uniform
    direction times ``radius * u^(1/3)``.  [n, 3]"""
    d = torch.randn(n, 3, generator=generator)
    d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return center[None] + d * (radius * torch.rand(n, 1, generator=generator) ** (1.0 / 3.0))


def random_points_in_frustums(
    n: int,
    viewmats: torch.Tensor,  # [C, 4, 4] world -> camera
    Ks: torch.Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    center: torch.Tensor,  # [3] scene centre
    radius: float,
    generator: Optional[torch.Generator] = None,
    min_views: float = 0.0,
    max_tries: int = 50,
) -> torch.Tensor:
    """``n`` points uniform in the ball (``center``, ``radius``) that are seen
    (in front of the camera and inside its image) by at least one camera and
    by at least a fraction ``min_views`` of the cameras.

    Rejection sampling; if the ball and the frustums barely overlap it falls
    back to unfiltered ball samples after ``max_tries`` rounds.  [n, 3]
    """
    kept = []
    total = 0
    for _ in range(max_tries):
        p = uniform_in_ball(max(2 * n, 1024), center, radius, generator)  # [m, 3]
        n_seen = seen_by(p, viewmats, Ks, width, height).sum(dim=0)  # [m]
        need = max(1, int(math.ceil(min_views * viewmats.shape[0])))
        p = p[n_seen >= need]
        kept.append(p)
        total += p.shape[0]
        if total >= n:
            break
    pts = torch.cat(kept, dim=0)
    if pts.shape[0] < n:  # frustums miss the ball: top up with plain ball samples
        pts = torch.cat([pts, uniform_in_ball(n - pts.shape[0], center, radius, generator)], dim=0)
    return pts[:n].contiguous()


# --------------------------------------------------------------------- PLY
def ply_attribute_names(sh_degree: int) -> list:
    """INRIA attribute names, in file order, for a model of max ``sh_degree``."""
    n_rest = 3 * (num_sh_bases(sh_degree) - 1)
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(n_rest)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    return names


def save_ply(model: GaussianModel, path) -> None:
    """Write ``model`` as an INRIA-style binary little-endian PLY (see module doc)."""
    from plyfile import PlyData, PlyElement

    p = {k: v.detach().cpu().float() for k, v in model.params.items()}
    n = p["means"].shape[0]
    normals = model.normals().detach().cpu().float()  # [N, 3]
    f_dc = p["sh0"].reshape(n, 3)  # [N, 3]
    # INRIA stores rest as [N, 3, K-1] flattened: channel-major.
    f_rest = p["shN"].transpose(1, 2).reshape(n, 3 * p["shN"].shape[1])  # [N, 3*(K-1)] (N may be 0)
    if model.primitive == "2dgs":
        thin = p["scales"].min(dim=1, keepdim=True).values + math.log(PLY_THIN_FACTOR)  # [N, 1]
        scales = torch.cat([p["scales"], thin], dim=1)  # [N, 3]
    else:
        scales = p["scales"]  # [N, 3]
    cols = [p["means"], normals, f_dc, f_rest, p["opacities"][:, None], scales, p["quats"]]
    data = torch.cat(cols, dim=1).numpy().astype(np.float32)  # [N, A]
    names = ply_attribute_names(model.sh_degree)
    assert data.shape[1] == len(names)
    arr = np.empty(n, dtype=[(name, "f4") for name in names])
    for i, name in enumerate(names):
        arr[name] = data[:, i]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    PlyData([PlyElement.describe(arr, "vertex")],
            comments=[f"{PLY_PRIMITIVE_COMMENT} {model.primitive}"]).write(str(tmp))
    tmp.replace(path)  # never leave a half-written point_cloud.ply behind


def load_ply(path, primitive: Optional[str] = None) -> GaussianModel:
    """Read a PLY written by :func:`save_ply` (or INRIA 3DGS/2DGS) into a model.

    The SH degree is inferred from the number of ``f_rest_*`` attributes.
    ``primitive`` (default: what the file says, module doc) "2dgs" reads
    surfels (ignoring ``scale_2``), "3dgs" three scales.

    Raises :class:`splat.errors.SplatInputError` naming the file for a
    missing, truncated or garbage file, a missing attribute, or values that
    are not finite (or whose activation is not: log-scales over ~88 overflow
    float32) or zero quaternions.
    """
    from plyfile import PlyData

    path = Path(path)
    if not path.is_file():
        raise SplatInputError(f"{path}: PLY file not found")
    try:
        ply = PlyData.read(str(path))
    except Exception as e:  # plyfile raises many types (header, element, EOF, numpy) for bad files
        raise SplatInputError(f"{path}: not a readable PLY file ({type(e).__name__}: {e})") from e
    if "vertex" not in [el.name for el in ply.elements]:
        raise SplatInputError(f"{path}: PLY has no 'vertex' element: not a Gaussian splat model")
    v = ply["vertex"]
    names = [p.name for p in v.properties]
    required = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1",
                "rot_0", "rot_1", "rot_2", "rot_3"]
    missing = [name for name in required if name not in names]
    if missing:
        raise SplatInputError(f"{path}: PLY vertex lacks attribute(s) {missing}: not a 3DGS/2DGS splat model")

    def col(name: str) -> np.ndarray:
        values = np.asarray(v[name], dtype=np.float32)
        if not np.all(np.isfinite(values)):
            row = int(np.argmax(~np.isfinite(values)))
            raise SplatInputError(f"{path}: attribute {name!r} is not finite at vertex {row} ({values[row]})")
        return values

    n_rest = len([x for x in names if x.startswith("f_rest_")])
    k_rest = n_rest // 3  # coefficients per channel beyond DC
    degree = int(round(math.sqrt(k_rest + 1))) - 1
    if num_sh_bases(degree) - 1 != k_rest or n_rest % 3 or any(f"f_rest_{i}" not in names for i in range(n_rest)):
        raise SplatInputError(f"{path}: {n_rest} f_rest attributes is not a valid SH layout")
    n = len(v["x"])
    means = np.stack([col("x"), col("y"), col("z")], axis=1)
    sh0 = np.stack([col(f"f_dc_{i}") for i in range(3)], axis=1)[:, None, :]  # [N, 1, 3]
    if k_rest:
        rest = np.stack([col(f"f_rest_{i}") for i in range(n_rest)], axis=1)  # [N, 3*(K-1)]
        shN = rest.reshape(n, 3, k_rest).transpose(0, 2, 1)  # [N, K-1, 3]
    else:
        shN = np.zeros((n, 0, 3), np.float32)
    quats = np.stack([col(f"rot_{i}") for i in range(4)], axis=1)
    zero = ~np.any(quats != 0, axis=1)
    if zero.any():
        raise SplatInputError(f"{path}: zero quaternion (rot_0..3) at vertex {int(np.argmax(zero))}")
    primitive = primitive or _ply_primitive(path, ply, names, col)
    if primitive not in PRIMITIVE_SCALES:
        raise SplatInputError(f"{path}: unknown primitive {primitive!r} (expected one of {list(PRIMITIVE_SCALES)})")
    if primitive == "3dgs" and "scale_2" not in names:
        raise SplatInputError(f"{path}: PLY vertex lacks scale_2: 3D Gaussians need three scales")
    scales = np.stack([col(f"scale_{i}") for i in range(PRIMITIVE_SCALES[primitive])], axis=1)  # log std devs
    with np.errstate(over="ignore"):
        huge = ~np.all(np.isfinite(np.exp(scales)), axis=1)
    if huge.any():
        row = int(np.argmax(huge))
        raise SplatInputError(f"{path}: log-scale {scales[row].max()} at vertex {row} overflows float32 "
                              "(scale_* hold log standard deviations)")
    params = {
        "means": torch.from_numpy(means),
        "quats": torch.from_numpy(quats),
        "scales": torch.from_numpy(scales),
        "opacities": torch.from_numpy(col("opacity")),
        "sh0": torch.from_numpy(np.ascontiguousarray(sh0)),
        "shN": torch.from_numpy(np.ascontiguousarray(shN)),
    }
    return GaussianModel(params, degree)


def _ply_primitive(path, ply, names, col) -> str:
    """The primitive a PLY holds (module doc): its comment, else its scales."""
    for comment in ply.comments:
        if comment.startswith(PLY_PRIMITIVE_COMMENT):
            value = comment[len(PLY_PRIMITIVE_COMMENT):].strip()
            if value not in PRIMITIVE_SCALES:
                raise SplatInputError(f"{path}: header comment names primitive {value!r}, "
                                      f"expected one of {list(PRIMITIVE_SCALES)}")
            return value
    if "scale_2" not in names:
        return "2dgs"
    s0, s1, s2 = col("scale_0"), col("scale_1"), col("scale_2")
    thin = np.minimum(s0, s1) + np.float32(math.log(PLY_THIN_FACTOR))
    return "2dgs" if np.allclose(s2, thin, rtol=0.0, atol=1e-5) else "3dgs"
