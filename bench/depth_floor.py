"""The depth error a photometrically exact render would still score: the
floor of ``test.depth_rel_err`` at depth discontinuities.  Prints JSON (and
writes it with --out).

    python bench/depth_floor.py --scene ../shared/scenes/still_life --out bench/results/depth_floor_still_life.json

The ground-truth depth (``<stem>_depth.npy``) is the camera z of the ray
through each pixel *centre*; the ground-truth photo is the *pixel's area*
(an antialiased render, or a real sensor).  A model that reproduces the
photo exactly covers a pixel on a silhouette partly with the near surface
and partly with the far one, and its expected depth ``sum w z / alpha``
blends the two: it cannot equal the centre ray's depth there.  This script
casts ``--samples`` x ``--samples`` stratified rays per pixel into the
scene's ground-truth mesh (``mesh.ply``, open3d) and scores

* ``centre``: the mesh's depth through the pixel centres against the
  stored depth (near 0: the mesh, the cameras and this script's pixel
  convention agree with the data);
* ``expected``: the mean depth of a pixel's hits (the expected depth of an
  exact opaque render, alpha-normalised as splat's is);
* ``median``: the depth where half the pixel's hits are nearer (the median
  depth of an exact render),

with the trainer's metric (:func:`splat.evaluation.frame_metrics`: mean of
``|z - z_gt| / z_gt`` over pixels with ground truth), in total and split
into the regions of ``bench/error_regions.py``: the discontinuities
(within ``--dilate`` pixels), split into ``silhouettes`` (next to pixels
without geometry) and ``occlusions``, and ``surface``, the other pixels
with geometry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from error_regions import silhouettes, view_regions  # noqa: E402
from mesh import read_mesh  # noqa: E402
from report import commit, emit, machine  # noqa: E402

from splat.errors import SplatInputError, run_cli  # noqa: E402


def subpixel_offsets(n: int):
    """The n x n stratified sample offsets inside a pixel, in (0, 1)^2 (cell centres).  [n*n, 2]"""
    import torch

    c = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    v, u = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([u.reshape(-1), v.reshape(-1)], -1)


def cast_depths(scene, viewmat, K, height: int, width: int, offsets):
    """Camera z of the first mesh hit of the rays through pixel (i, j) at
    ``offsets`` [S, 2] (from its corner), ``inf`` where nothing is hit.
    [H, W, S] float64"""
    import numpy as np
    import open3d as o3d
    import torch

    from splat.geometry import camera_to_world
    from splat.multiview import rays_through

    i, j = torch.meshgrid(
        torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64), indexing="ij"
    )
    pix = torch.stack([j, i], -1)[:, :, None, :] + offsets  # [H, W, S, 2]
    cam = rays_through(pix, K.double())  # [H, W, S, 3], z = 1
    vm = viewmat.double()
    origin = camera_to_world(vm, torch.zeros(1, 3, dtype=torch.float64))[0]  # [3]
    dirs = cam.reshape(-1, 3) @ vm[:3, :3]  # world direction with camera z = 1 per unit of t
    rays = torch.cat([origin.expand_as(dirs), dirs], -1).float().numpy()
    hit = scene.cast_rays(o3d.core.Tensor(rays))
    t = torch.from_numpy(hit["t_hit"].numpy().astype(np.float64))  # ray parameter = camera z (dir has z = 1)
    return t.reshape(height, width, offsets.shape[0])


def relative_error(z, z_gt, pick):
    """Summed ``|z - z_gt| / z_gt`` over the pixels ``pick``; a pixel the
    rays all miss counts as depth 0 (splat renders 0 where alpha is 0)."""
    z = z.nan_to_num(posinf=0.0)
    return float(((z[pick] - z_gt[pick]).abs() / z_gt[pick]).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scene", required=True, help="NeRF-layout scene with test depths and mesh.ply")
    ap.add_argument("--samples", type=int, default=8, help="rays per pixel side (default 8: 64 per pixel)")
    ap.add_argument("--max-bend", type=float, default=0.02)
    ap.add_argument("--dilate", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--debug", action="store_true")
    args = ap.parse_args()
    run_cli(lambda: measure(args), debug=args.debug)


def measure(args) -> None:
    import open3d as o3d
    import torch

    from splat.data.nerf import load_nerf
    from splat.evaluation import ground_truth_geometry

    if args.samples < 1:
        raise SplatInputError(f"--samples: must be at least 1, got {args.samples}")
    scene_dir = Path(args.scene)
    vertices, triangles = read_mesh(scene_dir / "mesh.ply")
    mesh = o3d.t.geometry.TriangleMesh()
    mesh.vertex.positions = o3d.core.Tensor(vertices.astype("float32"))
    mesh.triangle.indices = o3d.core.Tensor(triangles.astype("int32"))
    rays = o3d.t.geometry.RaycastingScene()
    rays.add_triangles(mesh)

    data = load_nerf(scene_dir)
    offsets = subpixel_offsets(args.samples)
    kinds = ("centre", "expected", "median")
    regions = ("silhouettes", "occlusions", "surface")
    sums = {k: {r: 0.0 for r in regions} for k in kinds}
    n_px = 0
    for f in data.test:
        z_gt, _ = ground_truth_geometry(scene_dir, f.stem, f.height, f.width)
        if z_gt is None:
            raise SplatInputError(f"{scene_dir}: test view {f.stem} has no {f.stem}_depth.npy")
        z_gt = z_gt.double()
        masks, _ = view_regions(z_gt, f.image, args.max_bend, args.dilate)
        edge = silhouettes(z_gt, args.dilate)
        masks = dict(
            silhouettes=masks["near_jumps"] & edge, occlusions=masks["near_jumps"] & ~edge, surface=masks["surface"]
        )
        centre = cast_depths(rays, f.viewmat, f.K, f.height, f.width, torch.full((1, 2), 0.5, dtype=torch.float64))
        samples = cast_depths(rays, f.viewmat, f.K, f.height, f.width, offsets)  # [H, W, S]
        hits = samples.isfinite()
        n_hits = hits.sum(-1)
        expected = torch.where(hits, samples, 0.0).sum(-1) / n_hits.clamp_min(1)
        expected[n_hits == 0] = float("inf")
        # Median of an opaque pixel: the depth at which the hits reach half the pixel's coverage.
        ordered = torch.where(hits, samples, float("inf")).sort(-1).values
        median = ordered.gather(-1, ((n_hits - 1).clamp_min(0) // 2)[..., None])[..., 0]
        geometry = z_gt > 0
        n_px += int(geometry.sum())
        for kind, z in (("centre", centre[..., 0]), ("expected", expected), ("median", median)):
            for r in regions:
                sums[kind][r] += relative_error(z, z_gt, masks[r] & geometry)
    report = dict(
        command=f"python bench/depth_floor.py {' '.join(sys.argv[1:])}",
        commit=commit(str(ROOT)),
        machine=machine(),
        scene=scene_dir.name,
        rays_per_pixel=args.samples**2,
        geometry_pixels=n_px,
        depth_rel_err={k: {r: v / n_px for r, v in sums[k].items()} for k in kinds},
    )
    for k in kinds:
        report["depth_rel_err"][k]["total"] = sum(sums[k].values()) / n_px
    emit(report, args.out)


if __name__ == "__main__":
    main()
