"""A predicted triangle mesh against a masked capture's SfM points, for
scenes with object masks and no ground-truth mesh (dtu_scan24): the
object's surface as the SfM points sample it, inside the masks.

::

    python bench/mesh_masked.py --scene ../shared/scenes/dtu_scan24 --model OUT --out bench/results/X.json
    python bench/mesh_masked.py --scene ... --mesh OUT/mesh.ply

The scene is a ``transforms.json`` folder whose frames name ``mask_path``
masks and whose ``ply_file_path`` holds the SfM points (read by splat's own
loader, every frame, train and test).  The object is where every view
agrees: a point is *inside the masks* when at least one view sees it in
front of the camera within the image, and every such view's mask is at
least 0.5 at its pixel (the visual hull of the masks).

* R: the SfM points inside the masks; D the diagonal of their box.
* S: ``--samples`` points uniform by area on the mesh
  (:func:`splat.mesh.metrics.sample_surface`), those inside the masks kept.
* accuracy: each s in S to the nearest point of R; completeness: each r in
  R to the mesh (exact point-to-triangle distance); Chamfer, precision,
  recall and F1 at 0.5 % of D exactly as ``bench/mesh.py``
  (:func:`splat.mesh.metrics.distance_scores`: capped at 4 % of D, as % of D).

R is a sparse, noisy sample of the surface (DTU's 34k SfM points, ~1 % of
D apart), so accuracy reads the distance to the nearest *sample* and is
inflated by their spacing; completeness (does the mesh reach every SfM
point?) is the sharper figure.  Both compare runs on one scene, not with
DTU's official Chamfer (millimetres against the structured-light scans,
which this folder does not hold).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from mesh import bench_main, mesh_parser, read_mesh  # noqa: E402
from report import commit, emit  # noqa: E402

from splat.errors import SplatInputError  # noqa: E402

#: A mask value at or above this is the object.
MASK_THRESHOLD = 0.5


def inside_masks(points, frames):
    """[M] bool: ``points`` [M, 3] (float64 numpy) inside the visual hull of
    the frames' ``object_mask`` (module doc), each frame's camera in
    splat's conventions (world -> camera ``viewmat``, pixel centres at
    j + 0.5)."""
    import numpy as np

    seen = np.zeros(len(points), dtype=bool)
    ok = np.ones(len(points), dtype=bool)
    for f in frames:
        V, K = f.viewmat.double().numpy(), f.K.double().numpy()
        X = points @ V[:3, :3].T + V[:3, 3]  # [M, 3] camera frame
        z = X[:, 2]
        front = z > 1e-9
        u = np.where(front, K[0, 0] * X[:, 0] / np.where(front, z, 1) + K[0, 2], -1)
        v = np.where(front, K[1, 1] * X[:, 1] / np.where(front, z, 1) + K[1, 2], -1)
        H, W = f.object_mask.shape
        inside = front & (u >= 0) & (u < W) & (v >= 0) & (v < H)
        mask = f.object_mask.numpy()
        cols, rows = np.floor(u[inside]).astype(np.int64), np.floor(v[inside]).astype(np.int64)
        on_object = np.zeros(len(points), dtype=bool)
        on_object[inside] = mask[rows, cols] >= MASK_THRESHOLD
        seen |= inside
        ok &= ~inside | on_object
    return seen & ok


def nearest_distances(queries, points, chunk: int = 4096):
    """[Q] float64: distance from each of ``queries`` [Q, 3] to the nearest of ``points`` [R, 3]."""
    import numpy as np
    import torch

    p = torch.from_numpy(np.ascontiguousarray(points, dtype=np.float64))
    out = np.empty(len(queries), dtype=np.float64)
    for s in range(0, len(queries), chunk):
        q = torch.from_numpy(np.ascontiguousarray(queries[s : s + chunk], dtype=np.float64))
        out[s : s + chunk] = torch.cdist(q, p).min(dim=1).values.numpy()
    return out


def build_parser():
    ap = mesh_parser("transforms.json folder with mask_path masks and SfM points")
    ap.description = __doc__.split("\n\n")[0]
    return ap


def run(args, argv) -> int:
    from splat.data import load_scene
    from splat.mesh.metrics import distance_scores, point_mesh_distance, sample_surface

    t0 = time.perf_counter()
    scene_dir = Path(args.scene)
    if not (scene_dir / "transforms.json").is_file():
        raise SplatInputError(
            f"{scene_dir / 'transforms.json'}: missing (this benchmark reads a transforms.json scene)"
        )
    scene = load_scene(scene_dir, layout="transforms", masks="ignore", test_every=0)
    frames = list(scene.train) + list(scene.test)
    if any(f.object_mask is None for f in frames):
        raise SplatInputError(f"{scene_dir / 'transforms.json'}: every frame needs a mask_path")
    if scene.points is None:
        raise SplatInputError(f"{scene_dir / 'transforms.json'}: no ply_file_path points to measure against")
    meshing = {}
    if args.model:
        from splat.mesh.extract import MeshOptions, extract_mesh

        t_mesh = time.perf_counter()
        mesh_path = extract_mesh(args.model, progress=False, options=MeshOptions())
        meshing = dict(mesh_seconds=round(time.perf_counter() - t_mesh, 2), model=str(args.model))
    else:
        mesh_path = Path(args.mesh)
    verts, tris = read_mesh(mesh_path)
    sfm = scene.points.double().numpy()
    reference = sfm[inside_masks(sfm, frames)]
    if len(reference) == 0:
        raise SplatInputError(f"{scene_dir}: no SfM point lies inside every mask that sees it")
    diag = float(math.dist(reference.min(0), reference.max(0)))
    samples = sample_surface(verts, tris, args.samples, seed=args.seed)
    samples = samples[inside_masks(samples, frames)]
    d_acc = nearest_distances(samples, reference)
    d_comp = point_mesh_distance(reference, verts, tris)
    res = distance_scores(d_acc, d_comp, diag)
    report = dict(
        benchmark="mesh_masked",
        mesh=str(mesh_path),
        scene=scene_dir.name,
        **meshing,
        **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in res.items()},
        diagonal=diag,
        sfm_points=int(len(sfm)),
        sfm_points_inside_masks=int(len(reference)),
        mesh_samples_inside_masks=int(len(samples)),
        completeness_median_pct=100 * float(sorted(d_comp)[len(d_comp) // 2]) / diag,
        views=len(frames),
        seconds=round(time.perf_counter() - t0, 2),
        commit=commit(str(ROOT)),
        date=time.strftime("%Y-%m-%d"),
        command="python bench/mesh_masked.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    emit(report, args.out)
    return 0


def main(argv=None) -> int:
    return bench_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
