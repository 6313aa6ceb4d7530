"""Distances between a predicted triangle mesh and a ground-truth one:
Chamfer, precision / recall / F1, and the share of the mesh no camera sees.

The definition (fixed, so that ``bench/mesh.py``'s figures compare across
runs and with ``docs/results.md``), for a predicted mesh P, a ground-truth mesh G and
reference points R (the ground-truth depth of the test views, back-projected
to world space by :func:`depth_points`):

* D, the diagonal of R's axis-aligned box; the box is padded by 5 % of D on
  every side (:func:`padded_box`).
* accuracy samples S: ``n`` points uniform by area on P
  (:func:`sample_surface`), those inside the padded box kept.
* ``d(x, M)``: the exact distance from point x to the nearest point of any
  triangle of mesh M (:func:`point_mesh_distance`), capped at ``c = 0.04 D``.
* ``accuracy = mean_{s in S} min(d(s, G), c)``,
  ``completeness = mean_{r in R} min(d(r, P), c)``,
  ``Chamfer = (accuracy + completeness) / 2``, each reported as % of D.
* with ``tau = 0.005 D``: ``precision = |{s : d(s, G) < tau}| / |S|``,
  ``recall = |{r : d(r, P) < tau}| / |R|``,
  ``F1 = 2 precision recall / (precision + recall)`` (0 when both are 0).
* unseen share: the fraction of S that no training camera sees
  (:func:`seen_mask`); S is uniform by area, so this estimates the share of
  P's area inside the box that no camera sees.

Everything here is a pure function of arrays (vertices [V, 3], triangles
[T, 3], points [M, 3], cameras in splat's convention: see
``splat/conventions.py``).  Only :func:`point_mesh_distance`,
:func:`seen_mask` and :func:`evaluate_mesh` need open3d (imported when
called); the rest needs numpy and torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple

import numpy as np
import torch

from ..geometry import camera_to_world, pixel_rays, seen_by

if TYPE_CHECKING:
    import open3d

__all__ = [
    "BOX_PAD_FRACTION",
    "CAP_FRACTION",
    "THRESHOLD_FRACTION",
    "DEFAULT_SAMPLES",
    "CHUNK",
    "depth_points",
    "padded_box",
    "in_box",
    "triangle_areas",
    "sample_surface",
    "point_mesh_distance",
    "distance_scores",
    "seen_mask",
    "evaluate_mesh",
]

#: The reference points' box is padded by this fraction of its diagonal D on every side.
BOX_PAD_FRACTION = 0.05
#: Distances are capped at this fraction of D before they are averaged.
CAP_FRACTION = 0.04
#: Precision and recall count distances below this fraction of D.
THRESHOLD_FRACTION = 0.005
#: Points sampled on the predicted mesh by default.
DEFAULT_SAMPLES = 200_000
#: Points (or rays) handed to open3d at once: bounds the memory of a query.
CHUNK = 1 << 20


def depth_points(depth: np.ndarray, K: np.ndarray, viewmat: np.ndarray) -> np.ndarray:
    """World points of the pixels of ``depth`` [H, W] (camera-space z through
    each pixel centre, 0 = nothing) with z > 0, for intrinsics ``K`` [3, 3] and
    world -> camera ``viewmat`` [4, 4] (OpenCV).  Row-major pixel order.  [M, 3] float64

    ``x_world = R^T (z K^-1 (j + 0.5, i + 0.5, 1)^T - t)`` for pixel (i, j),
    with :func:`splat.geometry.pixel_rays` and :func:`splat.geometry.camera_to_world`.
    """
    z = torch.as_tensor(np.asarray(depth, dtype=np.float64)).reshape(-1)  # [H*W]
    valid = z > 0
    rays = pixel_rays(torch.as_tensor(np.asarray(K, dtype=np.float64)), *depth.shape)[valid]  # [M, 3]
    world = camera_to_world(torch.as_tensor(np.asarray(viewmat, dtype=np.float64)), rays * z[valid, None])
    return world.numpy()


def padded_box(points: np.ndarray, pad: float = BOX_PAD_FRACTION) -> Tuple[np.ndarray, np.ndarray, float]:
    """(lo [3], hi [3], D): the axis-aligned box of ``points`` [M, 3] grown by
    ``pad * D`` on every side, and D = |max - min|, the diagonal of the box
    *before* padding (the unit all distances are reported in)."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) == 0:
        raise ValueError(f"padded_box needs points [M, 3] with M > 0, got shape {points.shape}")
    lo, hi = points.min(0), points.max(0)
    diag = float(np.linalg.norm(hi - lo))
    return lo - pad * diag, hi + pad * diag, diag


def in_box(points: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """[M] bool: ``lo <= p <= hi`` in every coordinate, for ``points`` [M, 3]."""
    return np.all((points >= lo) & (points <= hi), axis=1)


def triangle_areas(vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Area of each triangle, ``|(b - a) x (c - a)| / 2``.  [T] float64"""
    v = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]  # [T, 3] each
    return 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)


def sample_surface(vertices: np.ndarray, triangles: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` points uniform by area on the mesh (the same distribution as
    open3d's ``sample_points_uniformly``, but from numpy's seeded generator, so
    the same seed gives the same points on any machine and thread count).  [n, 3] float64

    A triangle is drawn with probability area / total area, then a point
    ``a + u (b - a) + v (c - a)`` with (u, v) uniform on the unit square,
    folded into the triangle (``u + v > 1 -> (1 - u, 1 - v)``), which is
    uniform on the triangle.
    """
    v = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    areas = triangle_areas(v, t)  # [T]
    total = float(areas.sum())
    if not total > 0:
        raise ValueError(f"the mesh has no area to sample ({len(t)} triangles, total area {total})")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(areas) / total  # [T]
    idx = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(t) - 1)  # [n]
    uv = rng.random((n, 2))  # [n, 2]
    fold = uv.sum(1) > 1.0
    uv[fold] = 1.0 - uv[fold]
    a, b, c = v[t[idx, 0]], v[t[idx, 1]], v[t[idx, 2]]  # [n, 3] each
    return a + uv[:, :1] * (b - a) + uv[:, 1:] * (c - a)


def _raycasting_scene(vertices: np.ndarray, triangles: np.ndarray):
    """An ``open3d.t.geometry.RaycastingScene`` holding the mesh (float32 vertices)."""
    import open3d as o3d

    scene = o3d.t.geometry.RaycastingScene()
    scene.add_triangles(
        o3d.core.Tensor(np.ascontiguousarray(vertices, dtype=np.float32)),
        o3d.core.Tensor(np.ascontiguousarray(triangles, dtype=np.uint32)),
    )
    return scene


def point_mesh_distance(
    points: np.ndarray,
    vertices: np.ndarray,
    triangles: np.ndarray,
    scene: Optional[open3d.t.geometry.RaycastingScene] = None,
) -> np.ndarray:
    """Exact distance from each of ``points`` [M, 3] to the nearest point of
    any triangle of the mesh (``vertices`` [V, 3], ``triangles`` [T, 3]):
    ``min_t min_{x in t} |p - x|``, by open3d's
    ``RaycastingScene.compute_distance`` (float32), in chunks of :data:`CHUNK`.
    ``scene``: a RaycastingScene of that mesh, to reuse one.  [M] float64"""
    import open3d as o3d

    scene = scene if scene is not None else _raycasting_scene(vertices, triangles)
    pts = np.asarray(points, dtype=np.float32)
    out = np.empty(len(pts), dtype=np.float64)
    for s in range(0, len(pts), CHUNK):
        q = o3d.core.Tensor(np.ascontiguousarray(pts[s : s + CHUNK]))
        out[s : s + CHUNK] = scene.compute_distance(q).numpy()
    return out


def distance_scores(
    d_acc: np.ndarray, d_comp: np.ndarray, diag: float, cap: float = CAP_FRACTION, threshold: float = THRESHOLD_FRACTION
) -> dict:
    """Accuracy, completeness, Chamfer (as % of ``diag``), precision, recall
    and F1 from the distances of the mesh samples to the ground truth
    (``d_acc`` [S]) and of the reference points to the mesh (``d_comp`` [R]).

    ``accuracy = mean(min(d_acc, cap D))``, ``completeness = mean(min(d_comp, cap D))``,
    ``chamfer = (accuracy + completeness) / 2``; ``precision = mean(d_acc < threshold D)``,
    ``recall = mean(d_comp < threshold D)``, ``F1 = 2 P R / (P + R)`` (0 when P = R = 0).
    An empty side gives NaN for its figures (and for Chamfer and F1).
    """
    d_acc = np.asarray(d_acc, dtype=np.float64)
    d_comp = np.asarray(d_comp, dtype=np.float64)
    cap_abs, tau = cap * diag, threshold * diag

    def mean(x):
        return float(x.mean()) if len(x) else float("nan")

    acc = mean(np.minimum(d_acc, cap_abs))
    comp = mean(np.minimum(d_comp, cap_abs))
    precision = mean(d_acc < tau)
    recall = mean(d_comp < tau)
    if precision + recall > 0:
        f1 = 2.0 * precision * recall / (precision + recall)
    else:
        f1 = 0.0 if precision == 0 and recall == 0 else float("nan")
    return dict(
        accuracy_pct=100.0 * acc / diag,
        completeness_pct=100.0 * comp / diag,
        chamfer_pct=100.0 * 0.5 * (acc + comp) / diag,
        precision=precision,
        recall=recall,
        f1=f1,
    )


def seen_mask(
    points: np.ndarray,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    widths: Sequence[int],
    heights: Sequence[int],
    gt_vertices: np.ndarray,
    gt_triangles: np.ndarray,
    tol: float,
    gt_scene: Optional[open3d.t.geometry.RaycastingScene] = None,
) -> np.ndarray:
    """[M] bool: point m of ``points`` [M, 3] is seen by at least one camera
    (``viewmats`` [C, 4, 4] world -> camera, ``Ks`` [C, 3, 3], image sizes
    ``widths``/``heights`` [C]) given the ground-truth mesh as occluder.

    Seen in camera c: it projects inside the image and lies in front of the
    camera (:func:`splat.geometry.seen_by`), and the ground-truth mesh does not
    hide it: the ray from the camera centre o towards the point p first hits
    the mesh at ``t_hit >= |p - o| - tol`` (or not at all).  This equals
    "camera depth <= ground-truth depth at that pixel + tol" up to the cosine
    between that ray and the pixel's optical axis.

    One ray per (point, camera) pair, only for points no earlier camera saw;
    at most :data:`CHUNK` rays at once.
    """
    import open3d as o3d

    pts = torch.as_tensor(np.asarray(points, dtype=np.float64))
    seen = np.zeros(len(pts), dtype=bool)
    scene = gt_scene if gt_scene is not None else _raycasting_scene(gt_vertices, gt_triangles)
    for c in range(len(viewmats)):
        todo = np.flatnonzero(~seen)
        if len(todo) == 0:
            break
        V = viewmats[c : c + 1].double()  # [1, 4, 4]
        visible = seen_by(pts[todo], V, Ks[c : c + 1].double(), int(widths[c]), int(heights[c]))[0].numpy()
        todo = todo[visible]
        origin = camera_to_world(V[0], torch.zeros(1, 3, dtype=torch.float64)).numpy()  # [1, 3] camera centre
        for s in range(0, len(todo), CHUNK):
            idx = todo[s : s + CHUNK]
            d = pts[idx].numpy() - origin  # [K, 3]
            dist = np.linalg.norm(d, axis=1)  # [K]
            rays = np.concatenate([np.broadcast_to(origin, d.shape), d / dist[:, None]], 1)  # [K, 6]
            hit = scene.cast_rays(o3d.core.Tensor(rays.astype(np.float32)))["t_hit"].numpy()  # [K], inf = miss
            seen[idx[hit >= dist - tol]] = True
    return seen


def evaluate_mesh(
    pred_vertices: np.ndarray,
    pred_triangles: np.ndarray,
    gt_vertices: np.ndarray,
    gt_triangles: np.ndarray,
    reference: np.ndarray,
    cameras: Optional[tuple] = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> dict:
    """All the figures of the module docstring for the predicted mesh
    (``pred_vertices`` [V, 3], ``pred_triangles`` [T, 3]) against the
    ground-truth mesh (``gt_vertices`` [V', 3], ``gt_triangles`` [T', 3]) and
    the reference points ``reference`` [R, 3], as one flat dict.

    ``cameras``: ``(viewmats [C, 4, 4], Ks [C, 3, 3], widths [C], heights [C])``
    of the training views, for ``unseen_share`` (None: not computed).
    ``samples`` points are drawn on the predicted mesh with ``seed``.
    """
    pred_vertices = np.asarray(pred_vertices, dtype=np.float64)
    pred_triangles = np.asarray(pred_triangles, dtype=np.int64)
    lo, hi, diag = padded_box(reference)
    if not diag > 0:
        raise ValueError("the reference points are a single point: their box has no diagonal")
    drawn = sample_surface(pred_vertices, pred_triangles, samples, seed)  # [n, 3]
    inside = in_box(drawn, lo, hi)
    pts = drawn[inside]  # [S, 3]
    gt_scene = _raycasting_scene(gt_vertices, gt_triangles)
    d_acc = point_mesh_distance(pts, gt_vertices, gt_triangles, scene=gt_scene)  # [S]
    d_comp = point_mesh_distance(reference, pred_vertices, pred_triangles)  # [R]
    res = distance_scores(d_acc, d_comp, diag)
    unseen = None
    if cameras is not None and len(pts):
        seen = seen_mask(pts, *cameras, gt_vertices, gt_triangles, tol=THRESHOLD_FRACTION * diag, gt_scene=gt_scene)
        unseen = float(1.0 - seen.mean())
    area = float(triangle_areas(pred_vertices, pred_triangles).sum())
    res.update(
        unseen_share=unseen,
        threshold_pct=100.0 * THRESHOLD_FRACTION,
        cap_pct=100.0 * CAP_FRACTION,
        box_pad_pct=100.0 * BOX_PAD_FRACTION,
        diagonal=diag,
        threshold=THRESHOLD_FRACTION * diag,
        cap=CAP_FRACTION * diag,
        box_min=lo.tolist(),
        box_max=hi.tolist(),
        n_reference_points=int(len(reference)),
        n_mesh_samples=int(len(pts)),
        n_mesh_samples_drawn=int(samples),
        sample_seed=int(seed),
        mesh_vertices=int(len(pred_vertices)),
        mesh_triangles=int(len(pred_triangles)),
        mesh_area=area,
        mesh_area_in_box=area * float(inside.mean()),
    )
    return res
