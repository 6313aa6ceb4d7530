"""A quick look at a mesh from one of the scene's cameras, without a GPU or
a display: the mesh's vertices are z-buffered into the view as points and
shaded by their normals ((n + 1) / 2 in RGB), beside the ground-truth image.

::

    python render.py --model OUT --mesh
    python scripts/mesh_preview.py --model OUT --view 0 --out docs/mesh.jpg

Dense TSDF meshes (vertices closer than a pixel) look solid this way; a
coarse mesh shows holes between its vertices.  Needs open3d (``.[mesh]``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_view_figure import ground_truth_bgr, write_strip  # noqa: E402

from splat.config import load_config  # noqa: E402
from splat.data import load_scene_from_config  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="training output folder (holds config.yaml and mesh.ply)")
    ap.add_argument("--split", choices=["test", "train"], default="test")
    ap.add_argument("--view", type=int, default=0)
    ap.add_argument("--width", type=int, default=320, help="width of each panel")
    ap.add_argument("--mesh", default="mesh.ply", help="mesh file in --model (default mesh.ply)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from splat.mesh.open3d_import import MissingOpen3D, import_open3d

    try:
        o3d = import_open3d("mesh_preview.py")
    except MissingOpen3D as e:
        raise SystemExit(f"error: {e}") from None

    model = Path(args.model)
    mesh = o3d.io.read_triangle_mesh(str(model / args.mesh))
    if len(mesh.vertices) == 0:
        raise SystemExit(f"--mesh: {model / args.mesh} is missing or empty; run render.py --mesh first")
    mesh.compute_vertex_normals()
    v = np.asarray(mesh.vertices)  # [M, 3]
    n = np.asarray(mesh.vertex_normals)  # [M, 3]

    scene = load_scene_from_config(load_config(model / "config.yaml", [])["data"])
    frame = getattr(scene, args.split)[args.view]
    V, K = frame.viewmat.double().numpy(), frame.K.double().numpy()
    cam = v @ V[:3, :3].T + V[:3, 3]
    z = cam[:, 2]
    front = z > 1e-6
    uv = cam[front] @ K.T
    j = np.floor(uv[:, 0] / uv[:, 2]).astype(np.int64)  # pixel (i, j) covers [j, j+1) x [i, i+1)
    i = np.floor(uv[:, 1] / uv[:, 2]).astype(np.int64)
    inside = (j >= 0) & (j < frame.width) & (i >= 0) & (i < frame.height)
    j, i, zf, nf = j[inside], i[inside], z[front][inside], n[front][inside]
    order = np.argsort(-zf)  # far first: nearer points overwrite
    img = np.zeros((frame.height, frame.width, 3), np.uint8)
    img[i[order], j[order]] = (((nf[order] + 1) / 2)[:, ::-1] * 255).clip(0, 255).astype(np.uint8)

    print(write_strip([ground_truth_bgr(frame), img], frame, args.width, args.out))


if __name__ == "__main__":
    main()
