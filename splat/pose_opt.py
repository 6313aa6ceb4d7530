"""Camera-pose optimisation (``train.pose_opt``): a learned rigid correction
of every train camera, its gauge, and the optimised poses on disk.

**Parametrisation.** Train camera i gets ξ_i = (ω_i, u_i) ∈ R^6, zero at the
start.  With R_i its camera -> world rotation and c_i its centre (as the data
give them), the corrected camera is::

    R_i' = exp([ω_i]x) R_i        turned by the rotation vector ω_i (radians, world axes) about its centre
    c_i' = c_i + r u_i            moved by u_i scene radii r (world axes)
    viewmat_i' = [R_i'^T | -R_i'^T c_i']

The exponential map of so(3) (``torch.linalg.matrix_exp`` of the 3x3 skew
matrix: exact, and smooth through zero, where the corrections start) with a
separate translation is six numbers per camera, none redundant: a step of
Adam moves each number by about the learning rate, so rotation (radians)
and translation (scene radii) share one learning rate with comparable
meaning.  (gsplat's ``CameraOptModule`` uses 9 numbers: a translation and
the 6-D continuous rotation of Zhou et al.; that is smooth everywhere but
has three redundant directions, which matters for large rotations, not for
the fraction of a degree SfM poses are off by.)  Rotating about the camera
centre rather than the world origin keeps the two blocks decoupled: a
rotation does not move the centre.

**The gauge.** Moving every camera and the scene by one similarity g
(rotation, translation, and scale, for which only the clipping planes and
the depth-distortion weight are not invariant) changes no photometric loss,
so the train loss cannot tell where the scene sits; the test cameras,
which are not optimised, can.  To first order such a motion changes every
correction by (ω_i, u_i) = (θ, (θ x c_i + t + s c_i) / r) for one (θ, t, s)
-- a 7-dimensional subspace of R^{6N}, spanned by the columns of B.  After
every optimiser step :meth:`PoseCorrection.fix_gauge` removes that subspace
from the optimiser's coordinates z (below, "The metric"): it projects z onto
the orthogonal complement of M^-1 B (``z <- z - Q Q^T z``, Q an orthonormal
basis of M^-1 B, float64; with M = I, ξ off B itself).  The optimised
cameras keep the data's mean position, orientation and spread, each
camera's correction measured by the image motion it makes, so the scene
stays in the frame the test cameras were given in.  The projection has to be
orthogonal in the coordinates the optimiser steps in: projected in ξ while
Adam steps in z, it undoes part of each step along the directions M
amplifies, Adam pushes again, and the corrections drift (docs/training.md has the
measurement).  Holding one camera fixed would fix the
gauge too, but would make that camera's error everyone's.

**The regulariser.** ``train.pose_opt_reg`` λ adds λ |ξ_i|^2 to camera i's
loss when it is drawn (a Gaussian prior centred on the given pose), an
explicit penalty rather than Adam's weight decay, so that it acts only
when the camera is drawn and means the same thing for any optimiser.

**The metric.** Adam moves each coordinate by about its learning rate,
whatever that coordinate means for the image.  In (ω, u) a turn of a camera
and a sideways shift move the image almost alike, so the error left after
the first few draws lies along their difference (an orbit about the scene,
told apart by parallax alone), where the gradient is small beside the
history that Adam normalises by, and the corrections all but stop (still_life,
1 deg perturbed: 0.56 deg of rotation error left, docs/training.md).  So
the optimiser does not see ξ_i but whitened coordinates z_i, ξ_i = M_i z_i
with M_i = (H_i + ε tr(H_i)/6 I)^(-1/2), where H_i is the mean over the
scene's primitives seen by camera i (weighted by opacity) of J^T J, J [2, 6]
the motion of a primitive's mean in normalised image coordinates
(pixels / focal length) per unit of ξ (:func:`image_motion_hessians`).  A
unit step of z moves the image by one radian of view (RMS over what the
camera sees) in any direction of the correction: turn, shift or orbit.  ε
(:data:`METRIC_DAMPING`) bounds the gain along a direction that moves
nothing (a camera seeing one flat wall, where a turn and a shift are the same
motion).  M_i is computed once, from the model at the first step that
corrects the poses (:meth:`PoseCorrection.set_metric`; summed over the
ranks' primitives), and kept in the checkpoint.

**The optimiser.** A camera is drawn about once per epoch, so the
corrections use :class:`splat.row_adam.RowAdam`: Adam with a step count per
camera, whose every update moves a correction by about the learning rate
(``torch.optim.SparseAdam`` counts steps per tensor and moves a camera drawn
k times by 3-6.5 times the rate, the size of the error being corrected).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .errors import SplatInputError

__all__ = [
    "PoseCorrection",
    "make_pose_correction",
    "skew",
    "corrected_viewmat",
    "gauge_basis",
    "image_motion_hessians",
    "whitening",
    "METRIC_DAMPING",
    "camera_to_world",
    "pose_key",
    "poses_json",
    "read_poses",
    "POSES_FILE",
]

#: The optimised train poses in a run folder.
POSES_FILE = "poses.json"
#: ε of the metric (module doc): the gain along a direction that moves nothing is at most 1/sqrt(ε) = 10.
METRIC_DAMPING = 0.01


def skew(w: torch.Tensor) -> torch.Tensor:
    """[..., 3] -> [..., 3, 3] with ``skew(w) @ x = w x x``."""
    z = torch.zeros_like(w[..., 0])
    return torch.stack(
        [
            torch.stack([z, -w[..., 2], w[..., 1]], -1),
            torch.stack([w[..., 2], z, -w[..., 0]], -1),
            torch.stack([-w[..., 1], w[..., 0], z], -1),
        ],
        -2,
    )


def corrected_viewmat(viewmat: torch.Tensor, xi: torch.Tensor, radius: float) -> torch.Tensor:
    """World -> camera [4, 4] of ``viewmat`` [4, 4] corrected by ``xi`` [6]
    (ω, u: module doc), differentiable in ``xi``."""
    xi = xi.to(viewmat.dtype)
    R_wc = viewmat[:3, :3]  # [3, 3] world -> camera
    centre = -(R_wc.T @ viewmat[:3, 3])  # [3]
    R_cw = torch.linalg.matrix_exp(skew(xi[:3])) @ R_wc.T  # [3, 3] corrected camera -> world
    c = centre + radius * xi[3:]  # [3]
    R = R_cw.T
    top = torch.cat([R, -(R @ c)[:, None]], 1)  # [3, 4]
    return torch.cat([top, viewmat[3:]], 0)


def camera_to_world(viewmat: torch.Tensor) -> torch.Tensor:
    """[..., 4, 4] world -> camera to camera -> world: the rigid inverse (so
    also camera -> world to world -> camera)."""
    R = viewmat[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(viewmat)
    out[..., :3, :3] = R
    out[..., :3, 3] = -(R @ viewmat[..., :3, 3:])[..., 0]
    out[..., 3, 3] = 1
    return out


def gauge_basis(centres: torch.Tensor, radius: float) -> torch.Tensor:
    """[6N, 7] orthonormal (float64) basis of the corrections that a joint
    similarity motion of every camera with centres ``centres`` [N, 3] makes
    (module doc): rotation θ (3), translation t (3), scale s (1)."""
    c = centres.double()
    n = c.shape[0]
    cols = []
    eye = torch.eye(3, dtype=torch.float64)
    for k in range(3):  # rotation about the world axis k: ω = e_k, u = e_k x c / r
        cols.append(torch.cat([eye[k].expand(n, 3), torch.linalg.cross(eye[k].expand(n, 3), c) / radius], 1))
    for k in range(3):  # translation: u = e_k / r
        cols.append(torch.cat([torch.zeros(n, 3, dtype=torch.float64), eye[k].expand(n, 3) / radius], 1))
    cols.append(torch.cat([torch.zeros(n, 3, dtype=torch.float64), c / radius], 1))  # scale about the origin
    B = torch.stack([col.reshape(-1) for col in cols], 1)  # [6N, 7]
    U, S, _ = torch.linalg.svd(B, full_matrices=False)
    # Fewer than 3 cameras (or collinear ones) span fewer gauge directions: keep those that
    # exist (one camera: all six of its own, which leaves nothing to optimise, rightly).
    return U[:, S > 1e-9 * S.max()]


def image_motion_hessians(
    means: torch.Tensor,
    weights: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    sizes,
    radius: float,
    near: float = 0.0,
    far: float = float("inf"),
    chunk: int = 1 << 16,
):
    """Per camera, the weighted sum over the primitives it sees of J^T J, and
    the sum of their weights (module doc, "The metric"): ([N, 6, 6], [N])
    float64, to be summed over ranks before :func:`whitening`.

    ``means`` [G, 3] and ``weights`` [G] (opacities) of the primitives;
    ``viewmats`` [N, 4, 4] world -> camera and ``Ks`` [N, 3, 3] of the cameras
    as given, ``sizes`` their N (width, height).  J [2, 6] is d(x/z, y/z)/dξ
    at ξ = 0 for the mean's camera coordinates (x, y, z) = R (X - c):
    d/dω = R [X - c]x (the camera turns by ω about c, so X turns by -ω in
    it), d/du = -r R.  A primitive is seen when the render draws its centre:
    depth z in (``near``, ``far``) and above 1e-3 r, inside the image.
    Primitives are taken ``chunk`` at a time (the temporaries are ~200
    bytes a primitive)."""
    X, w = means.double(), weights.double()
    H = torch.zeros(len(viewmats), 6, 6, dtype=torch.float64, device=X.device)
    total = torch.zeros(len(viewmats), dtype=torch.float64, device=X.device)
    for i, (V, K, (width, height)) in enumerate(zip(viewmats.double(), Ks.double(), sizes)):
        R = V[:3, :3].to(X.device)
        centre = -(R.T @ V[:3, 3].to(X.device))  # [3]
        for start in range(0, X.shape[0], chunk):
            a = X[start : start + chunk] - centre  # [G, 3] X - c
            ws = w[start : start + chunk]
            xc = a @ R.T  # [G, 3]
            z = xc[:, 2]
            zs = z.clamp_min(1e-3 * radius)
            px = K[0, 0] * xc[:, 0] / zs + K[0, 2]
            py = K[1, 1] * xc[:, 1] / zs + K[1, 2]
            seen = (z > max(1e-3 * radius, near)) & (z < far) & (ws > 0)
            seen &= (px >= 0) & (px < width) & (py >= 0) & (py < height)
            a, xc, z, ws = a[seen], xc[seen], z[seen], ws[seen]
            P = torch.zeros(len(z), 2, 3, dtype=torch.float64, device=X.device)  # d(x/z, y/z)/d(x, y, z)
            P[:, 0, 0] = P[:, 1, 1] = 1 / z
            P[:, 0, 2] = -xc[:, 0] / z.square()
            P[:, 1, 2] = -xc[:, 1] / z.square()
            d_dxi = torch.cat([R @ skew(a), (-radius * R).expand(len(z), 3, 3)], 2)  # [G, 3, 6]
            J = P @ d_dxi  # [G, 2, 6]
            H[i] += torch.einsum("g,gki,gkj->ij", ws, J, J)
            total[i] += ws.sum()
    return H, total


def whitening(H: torch.Tensor, total: torch.Tensor, damping: float = METRIC_DAMPING) -> torch.Tensor:
    """[N, 6, 6] M_i = (H_i / total_i + ε tr/6 I)^(-1/2) of :func:`image_motion_hessians`'
    sums (module doc); the identity for a camera that sees nothing."""
    mean = H / total.clamp_min(1e-300)[:, None, None]
    trace = mean.diagonal(dim1=1, dim2=2).sum(1)  # [N]
    eye = torch.eye(6, dtype=H.dtype, device=H.device)
    damped = mean + (damping * trace / 6)[:, None, None] * eye
    e, Q = torch.linalg.eigh(damped)
    M = Q @ torch.diag_embed(e.clamp_min(1e-300).rsqrt()) @ Q.transpose(1, 2)
    blind = (total <= 0) | ~(trace > 0)
    return torch.where(blind[:, None, None], eye, M)


class PoseCorrection(nn.Module):
    """Per-train-camera corrections ξ_i = (ω_i, u_i) = ``metric``_i @
    ``delta``_i (module doc): ``delta`` [N, 6] the whitened coordinates that
    the optimiser moves, looked up with sparse gradients (only the drawn
    cameras' rows); ``metric`` [N, 6, 6] the identity until :meth:`set_metric`.

    ``viewmats`` [N, 4, 4]: the train cameras as given (their centres define
    the gauge); ``radius``: the scene radius r (the unit of u)."""

    def __init__(self, viewmats: torch.Tensor, radius: float):
        super().__init__()
        self.radius = float(radius)
        self.delta = nn.Parameter(torch.zeros(viewmats.shape[0], 6))
        centres = camera_to_world(viewmats.double())[:, :3, 3]  # [N, 3]
        self.register_buffer("gauge", gauge_basis(centres, self.radius), persistent=False)  # [6N, k]
        self.register_buffer("metric", torch.eye(6).repeat(viewmats.shape[0], 1, 1))  # [N, 6, 6]
        self.register_buffer("metric_set", torch.tensor(False))
        self.has_metric = False  # metric_set as a Python bool (read every step: no device sync)
        self.register_buffer("gauge_z", self.gauge.clone(), persistent=False)  # [6N, k] orthonormal basis of M^-1 B

    def corrections(self, dtype=None) -> torch.Tensor:
        """[N, 6] every ξ_i (module doc), with autograd, in ``dtype`` (default: the parameters')."""
        dtype = dtype or self.delta.dtype
        return (self.metric.to(dtype) @ self.delta.to(dtype)[:, :, None])[:, :, 0]

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As ``nn.Module``'s; a state without ``metric`` (saved before splat
        had it) loads with the identity, set afresh at the next corrected step."""
        state_dict = dict(state_dict)
        state_dict.setdefault("metric", torch.eye(6).repeat(self.delta.shape[0], 1, 1))
        state_dict.setdefault("metric_set", torch.tensor(False))
        result = super().load_state_dict(state_dict, strict, assign)
        self.has_metric = bool(self.metric_set)
        with torch.no_grad():
            self._set_gauge_z()
        return result

    @torch.no_grad()
    def set_metric(self, metric: torch.Tensor) -> None:
        """Takes ``metric`` [N, 6, 6] (:func:`whitening`) as M, keeping every
        correction ξ (``delta`` becomes M^-1 ξ)."""
        xi = self.corrections(torch.float64)
        self.metric.copy_(metric.to(self.metric.dtype))
        self._set_corrections(xi)
        self.metric_set.fill_(True)
        self.has_metric = True
        self._set_gauge_z()

    def _set_gauge_z(self) -> None:
        """``gauge_z``: an orthonormal basis of M^-1 B (module doc, "The gauge"); B itself while M = I."""
        if not self.has_metric:
            self.gauge_z.copy_(self.gauge)
            return
        n, k = self.delta.shape[0], self.gauge.shape[1]
        inverse = torch.linalg.inv(self.metric.double())  # [N, 6, 6]
        basis = (inverse @ self.gauge.double().reshape(n, 6, k)).reshape(6 * n, k)
        self.gauge_z.copy_(torch.linalg.qr(basis).Q.to(self.gauge_z.dtype))

    def _set_corrections(self, xi: torch.Tensor) -> None:
        """``delta`` <- M^-1 ``xi`` [N, 6]."""
        z = torch.linalg.solve(self.metric.double(), xi.double()[:, :, None])[:, :, 0]
        self.delta.copy_(z.to(self.delta.dtype))

    def row(self, index: int) -> torch.Tensor:
        """ξ_index [6] with a sparse gradient."""
        i = torch.tensor([int(index)], device=self.delta.device)
        return self.metric[int(index)] @ F.embedding(i, self.delta, sparse=True)[0]

    def viewmat(self, index: int, viewmat: torch.Tensor) -> torch.Tensor:
        """Train camera ``index``'s corrected world -> camera [4, 4] (``viewmat`` as given)."""
        return corrected_viewmat(viewmat, self.row(index), self.radius)

    def penalty(self, index: int) -> torch.Tensor:
        """|ξ_index|^2 (the regulariser's term of camera ``index``)."""
        return self.row(index).square().sum()

    @torch.no_grad()
    def fix_gauge(self) -> None:
        """Projects the optimiser's coordinates off the gauge directions (module doc)."""
        z = self.delta.double().reshape(-1, 1)  # [6N, 1]
        Q = self.gauge_z.to(z.device)
        self.delta.copy_((z - Q @ (Q.T @ z)).reshape(self.delta.shape).to(self.delta.dtype))

    @torch.no_grad()
    def gauge_part(self) -> torch.Tensor:
        """[k] the coordinates' components along the gauge (zero after :meth:`fix_gauge`)."""
        return (self.gauge_z.T @ self.delta.double().reshape(-1, 1))[:, 0]

    @torch.no_grad()
    def viewmats(self, viewmats: torch.Tensor) -> torch.Tensor:
        """Every corrected world -> camera [N, 4, 4] of ``viewmats`` [N, 4, 4] (detached)."""
        return torch.stack(
            [
                corrected_viewmat(v, d, self.radius)
                for v, d in zip(viewmats, self.corrections(torch.float64).detach().cpu())
            ]
        )


def make_pose_correction(train_cfg: Dict, frames: Sequence, radius: float, device=None) -> Optional[PoseCorrection]:
    """The corrections ``train.pose_opt`` asks for, of the train ``frames`` (None when off)."""
    if not train_cfg["pose_opt"]:
        return None
    return PoseCorrection(torch.stack([f.viewmat.double() for f in frames]), radius).to(device)


def pose_key(frame, data_root) -> str:
    """The name ``poses.json`` gives ``frame``: its image path relative to the
    data folder (``images/train_003.png``), or as loaded if it lies elsewhere."""
    path = Path(frame.image_path)
    try:
        return path.resolve().relative_to(Path(data_root).resolve()).as_posix()
    except ValueError:
        return str(path)


def poses_json(frames: Sequence, viewmats: torch.Tensor, data_root) -> bytes:
    """The bytes of ``poses.json``: {:func:`pose_key`: 4x4 camera -> world,
    OpenCV axes, in the data's world frame} of ``frames`` posed by ``viewmats``
    [N, 4, 4] (world -> camera).  The caller writes them (atomically)."""
    c2w = camera_to_world(viewmats.double().cpu())
    body = {pose_key(f, data_root): [[float(x) for x in row] for row in m.tolist()] for f, m in zip(frames, c2w)}
    return (json.dumps(body, indent=1) + "\n").encode()


def _rigid(m: torch.Tensor) -> bool:
    """``m`` is a finite 4x4 rotation-and-translation matrix."""
    if m.shape != (4, 4) or not bool(torch.isfinite(m).all()):
        return False
    R, eye = m[:3, :3], torch.eye(3, dtype=m.dtype)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=m.dtype)
    return torch.allclose(R @ R.T, eye, atol=1e-5) and float(torch.det(R)) > 0 and torch.allclose(m[3], bottom)


def read_poses(path: Path, frames: Sequence, data_root) -> None:
    """Replaces the ``viewmat`` of each of ``frames`` by its pose in the
    ``poses.json`` at ``path`` (a :class:`splat.errors.SplatInputError`
    naming the file when it is unreadable, lacks a frame or holds no rigid
    4x4 matrix)."""
    try:
        body = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SplatInputError(f"{path}: cannot read the optimised poses ({e})") from None
    for f in frames:
        key = pose_key(f, data_root)
        try:
            m = torch.tensor(body[key], dtype=torch.float64)
        except (KeyError, TypeError, ValueError):
            raise SplatInputError(f"{path}: no 4x4 pose for train image {key!r}") from None
        if not _rigid(m):
            raise SplatInputError(f"{path}: the pose of {key!r} is not a rigid 4x4 camera-to-world matrix")
        f.viewmat = camera_to_world(m).to(f.viewmat.dtype)
