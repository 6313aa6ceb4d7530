"""A predicted triangle mesh against a scene's ground-truth mesh: Chamfer,
precision / recall / F1 at 0.5 % of the scene's diagonal, and the share of
the mesh's area no training camera sees (issue 30's definition, in
``splat/mesh/metrics.py``).

::

    python bench/mesh.py --scene ../shared/scenes/still_life --mesh OUT/mesh.ply
    python bench/mesh.py --scene ... --mesh ... --out bench/results/mesh_fast.json [--samples 200000] [--seed 0]

The scene is a NeRF-layout folder (loaded by splat's own loader,
``splat.data.nerf.load_nerf``) holding ``transforms_train.json``,
``transforms_test.json``, ``<test image stem>_depth.npy`` for every test view
(camera-space z through each pixel centre, 0 where nothing is hit, read as the
trainer's evaluation reads it) and ``mesh.ply``, the ground-truth mesh
(``--gt-mesh`` names another).

The reference points are the valid pixels of all test depths, back-projected
to world space; distances are reported as % of the diagonal D of their box.
Prints one flat JSON object (also written to ``--out``); a missing or
unusable file is one line ``error: <file>: ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit  # noqa: E402

from splat.errors import SplatInputError, run_cli  # noqa: E402
from splat.mesh.metrics import DEFAULT_SAMPLES  # noqa: E402


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def mesh_parser(scene_help: str) -> argparse.ArgumentParser:
    """The arguments a mesh benchmark shares: --scene, --mesh or --model,
    --out, --samples, --seed, --debug."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scene", required=True, help=scene_help)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--mesh", help="the predicted triangle mesh (.ply, .obj, ...)")
    what.add_argument(
        "--model",
        help="a training output folder: mesh it as render.py --mesh does "
        "(timed; writes MODEL/mesh.ply), then measure that mesh",
    )
    ap.add_argument("--out", help="write the JSON here too (e.g. bench/results/mesh_fast.json)")
    ap.add_argument(
        "--samples",
        type=_positive_int,
        default=DEFAULT_SAMPLES,
        help=f"points sampled by area on the predicted mesh (default {DEFAULT_SAMPLES})",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of those samples (default 0)")
    ap.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    return ap


def build_parser() -> argparse.ArgumentParser:
    ap = mesh_parser("NeRF-layout scene folder with test depths and mesh.ply")
    ap.add_argument("--mesh-res", type=int, default=None, help="with --model: render.py's --mesh-res")
    ap.add_argument("--depth-ratio", type=float, default=None, help="with --model: render.py's --depth-ratio")
    ap.add_argument("--keep-unseen", action="store_true", help="with --model: render.py's --keep-unseen")
    ap.add_argument("--gt-mesh", help="ground-truth mesh (default: SCENE/mesh.ply)")
    return ap


def read_mesh(path: Path):
    """(vertices [V, 3] float64, triangles [T, 3] int64) of a triangle mesh file."""
    import numpy as np

    from splat.mesh.open3d_import import MissingOpen3D, import_open3d

    try:
        o3d = import_open3d("bench/mesh.py")
    except MissingOpen3D as e:  # names a missing system library (libusb-1.0.so.0) and its package
        raise SplatInputError(str(e)) from e
    if not path.is_file():
        raise SplatInputError(f"{path}: mesh file not found")
    o3d.utility.set_verbosity_level(o3d.utility.VerbosityLevel.Error)  # the error below says it in one line
    mesh = o3d.io.read_triangle_mesh(str(path))
    if len(mesh.triangles) == 0:
        raise SplatInputError(f"{path}: no triangles in this file (not a triangle mesh, or unreadable)")
    return np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.triangles, dtype=np.int64)


def load_views(scene_dir: Path):
    """(reference points [R, 3], train cameras (viewmats [C, 4, 4], Ks [C, 3, 3], widths, heights),
    number of test views) of a NeRF-layout scene."""
    import numpy as np
    import torch

    from splat.data.nerf import load_nerf
    from splat.evaluation import ground_truth_geometry
    from splat.mesh.metrics import depth_points

    test_json = scene_dir / "transforms_test.json"
    if not test_json.is_file():
        raise SplatInputError(f"{test_json}: missing json file (the test views' cameras)")
    scene = load_nerf(scene_dir)
    if not scene.test:
        raise SplatInputError(f"{test_json}: no test frames")
    pts = []
    for f in scene.test:
        depth, _ = ground_truth_geometry(scene_dir, f.stem, f.height, f.width)
        if depth is None:
            raise SplatInputError(
                f"{scene_dir / (f.stem + '_depth.npy')}: missing ground-truth depth of test view {f.stem}"
            )
        pts.append(depth_points(depth.numpy(), f.K.double().numpy(), f.viewmat.double().numpy()))
    reference = np.concatenate(pts)
    if len(reference) == 0:
        raise SplatInputError(f"{scene_dir}: the test depths have no valid pixel (all 0)")
    train = scene.train
    cameras = (
        torch.stack([f.viewmat for f in train]).double(),
        torch.stack([f.K for f in train]).double(),
        [f.width for f in train],
        [f.height for f in train],
    )
    return reference, cameras, len(scene.test)


def run(args, argv) -> int:
    import math

    from splat.mesh.metrics import evaluate_mesh

    t0 = time.perf_counter()
    scene_dir = Path(args.scene)
    if not scene_dir.is_dir():
        raise SplatInputError(f"{scene_dir}: scene folder not found")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise SplatInputError(f"{args.out}: the folder to write it in does not exist")
    gt_path = Path(args.gt_mesh) if args.gt_mesh else scene_dir / "mesh.ply"
    meshing = {}
    if args.model:
        from splat.mesh.extract import MeshOptions, extract_mesh

        options = MeshOptions(depth_ratio=args.depth_ratio, keep_unseen=args.keep_unseen)
        if args.mesh_res:
            options.mesh_res = args.mesh_res
        import torch

        from splat.trainer import peak_memory_mb

        t_mesh = time.perf_counter()
        rss_before = peak_memory_mb(torch.device("cpu"))
        mesh_path = extract_mesh(args.model, progress=False, options=options)
        # The process's peak resident memory: loading the run and meshing it
        # (nothing else has run yet but imports, rss_before_mesh_mb).
        peak = peak_memory_mb(torch.device("cpu"))
        meshing = dict(
            mesh_seconds=round(time.perf_counter() - t_mesh, 2),
            mesh_peak_rss_mb=round(peak),
            rss_before_mesh_mb=round(rss_before),
            mesh_res=options.mesh_res,
            depth_ratio=args.depth_ratio,
            keep_unseen=args.keep_unseen,
            model=str(args.model),
        )
    else:
        mesh_path = Path(args.mesh)
    pred_v, pred_t = read_mesh(mesh_path)
    gt_v, gt_t = read_mesh(gt_path)
    reference, cameras, n_test = load_views(scene_dir)
    res = evaluate_mesh(pred_v, pred_t, gt_v, gt_t, reference, cameras, samples=args.samples, seed=args.seed)
    res = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in res.items()}
    report = dict(
        benchmark="mesh",
        mesh=str(mesh_path),
        scene=str(scene_dir),
        gt_mesh=str(gt_path),
        **meshing,
        **res,
        n_test_views=n_test,
        n_train_views=len(cameras[2]),
        gt_vertices=int(len(gt_v)),
        gt_triangles=int(len(gt_t)),
        seconds=round(time.perf_counter() - t0, 2),
        commit=commit(str(ROOT)),
        date=time.strftime("%Y-%m-%d"),
        command="python bench/mesh.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    emit(report, args.out)
    return 0


def bench_main(parser: argparse.ArgumentParser, run_bench, argv=None) -> int:
    """Parses ``argv`` with ``parser`` and runs ``run_bench(args, argv)`` with
    one-line errors for bad input (``--debug``: full tracebacks)."""
    args = parser.parse_args(argv)
    from splat.data.types import DataError

    return run_cli(lambda: run_bench(args, argv), debug=args.debug, extra=(DataError,))


def main(argv=None) -> int:
    return bench_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
