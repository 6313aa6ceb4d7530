"""PLY files of a :class:`~splat.model.GaussianModel`: INRIA's 3DGS layout.

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
from typing import List, Optional

import numpy as np
import torch

from .errors import SplatInputError
from .model import PRIMITIVE_SCALES, GaussianModel
from .sh import MAX_SH_DEGREE, num_sh_bases

#: Thickness of the normal axis written to PLY, relative to the smaller tangent scale.
PLY_THIN_FACTOR = 1e-2
#: PLY header comment naming the primitive ("splat primitive 2dgs" / "... 3dgs").
PLY_PRIMITIVE_COMMENT = "splat primitive"


def ply_attribute_names(sh_degree: int) -> List[str]:
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
    PlyData([PlyElement.describe(arr, "vertex")], comments=[f"{PLY_PRIMITIVE_COMMENT} {model.primitive}"]).write(
        str(tmp)
    )
    tmp.replace(path)  # never leave a half-written point_cloud.ply behind


def load_ply(path, primitive: Optional[str] = None) -> GaussianModel:
    """Read a PLY written by :func:`save_ply` (or INRIA 3DGS/2DGS) into a model.

    The SH degree is inferred from the number of ``f_rest_*`` attributes.
    ``primitive`` (default: what the file says, module doc) "2dgs" reads
    surfels (ignoring ``scale_2``), "3dgs" three scales.

    Raises :class:`splat.errors.SplatInputError` naming the file for a
    missing, truncated or garbage file, a missing attribute, or values that
    are not finite (or whose activation is not: log-scales over ~88 overflow
    float32) or zero quaternions, and an SH degree above
    :data:`splat.sh.MAX_SH_DEGREE` (3: 45 ``f_rest_*``).
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
    required = [
        "x",
        "y",
        "z",
        "f_dc_0",
        "f_dc_1",
        "f_dc_2",
        "opacity",
        "scale_0",
        "scale_1",
        "rot_0",
        "rot_1",
        "rot_2",
        "rot_3",
    ]
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
    if degree > MAX_SH_DEGREE:
        # Refused here, naming the file: the rasterizers stop at degree 3, so
        # such a model would load and then fail at its first render.
        most = 3 * (num_sh_bases(MAX_SH_DEGREE) - 1)
        raise SplatInputError(
            f"{path}: {n_rest} f_rest attributes (SH degree {degree}); "
            f"at most {most} (degree {MAX_SH_DEGREE}) are supported"
        )
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
        raise SplatInputError(
            f"{path}: log-scale {scales[row].max()} at vertex {row} overflows float32 "
            "(scale_* hold log standard deviations)"
        )
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
            value = comment[len(PLY_PRIMITIVE_COMMENT) :].strip()
            if value not in PRIMITIVE_SCALES:
                raise SplatInputError(
                    f"{path}: header comment names primitive {value!r}, expected one of {list(PRIMITIVE_SCALES)}"
                )
            return value
    if "scale_2" not in names:
        return "2dgs"
    s0, s1, s2 = col("scale_0"), col("scale_1"), col("scale_2")
    thin = np.minimum(s0, s1) + np.float32(math.log(PLY_THIN_FACTOR))
    return "2dgs" if np.allclose(s2, thin, rtol=0.0, atol=1e-5) else "3dgs"
