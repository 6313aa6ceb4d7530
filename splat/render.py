"""Rendering a trained model: per-view images/depth/normals, and TSDF meshes.

``python render.py --model OUT --split test`` writes, for every view of the
split (``<stem>`` = image file name without extension)::

    OUT/renders/<split>/rgb/<stem>.png      8-bit sRGB render over the config's background
    OUT/renders/<split>/depth/<stem>.npy    float32 [H, W] camera-space z, 0 where nothing is hit
    OUT/renders/<split>/normal/<stem>.npy   float32 [H, W, 3] world-space unit normals facing
                                            the camera (0 where alpha = 0)
    OUT/renders/<split>/alpha/<stem>.npy    float32 [H, W] accumulated opacity

Depth choice (config ``render.depth``, default ``expected``): the
*expected* depth ``sum w z / alpha`` (normalised by alpha, so the background
does not pull it towards 0).  We measured both on data/sample_scene (NeRF
layout, 1000 steps, test views, mean |z - z_gt| / z_gt over pixels with
z_gt > 0): expected 1.6 %, *median* 6.4 %.  The median (the z of the last
surfel entered with T > 0.5) is not averaged across surfaces, but where a
pixel's alpha stays below 0.5 it is the z of whatever surfel came last
(often a floater far behind), and it is noisier on surfaces too (2.8 % vs
2.0 % where alpha >= 0.5).  ``render.depth=median`` selects the median; the
trainer's depth metrics and the TSDF mesh use the same choice.

``python render.py --model OUT --mesh`` renders every train view and fuses
the depth (pixels with alpha >= 0.5 only, so that soft silhouettes do not
smear) and colour with open3d's ``ScalableTSDFVolume``.  As in 2DGS:
``depth_trunc = 2 * scene_radius`` (scene_radius = 3DGS camera extent, i.e.
1.1 x the largest camera distance from the camera centroid, so anything
farther is background), ``voxel = depth_trunc / mesh_res`` (mesh_res 1024 by
default) and ``sdf_trunc = 5 * voxel``.  If ScalableTSDFVolume returns an
empty mesh (the open3d-cpu 0.20 wheel does, even for a single flat depth
map), it falls back to a UniformTSDFVolume over the bounding cube of the
fused depth points (at most 384^3 voxels) and says so.  open3d is optional:
without it ``--mesh`` prints "pip install open3d" and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .errors import SplatInputError
from .progress import use_progress_bar

#: Set by tests/tools to substitute a rasterizer with the same signature.
RASTERIZE_OVERRIDE = None


def get_rasterize():
    """``splat.rasterize`` (imported lazily so this module loads without it)."""
    if RASTERIZE_OVERRIDE is not None:
        return RASTERIZE_OVERRIDE
    import splat

    fn = getattr(splat, "rasterize", None)
    if callable(fn):
        return fn
    from splat.rasterize import rasterize

    return rasterize


def render_frame(
    model,
    frame,
    background: Optional[torch.Tensor] = None,  # [3]
    sh_degree: Optional[int] = None,
    backend: str = "auto",
    near: float = 0.2,
    far: float = 100.0,
    device: Optional[torch.device] = None,
):
    """Rasterize ``model`` (a :class:`splat.model.GaussianModel`) in ``frame``'s camera.

    ``sh_degree`` (default: the model's max) selects how many SH bands are used.
    Returns the rasterizer's output object (rgb, alpha, depth, median_depth,
    normal, distortion, radii, means2d).
    """
    d = model.sh_degree if sh_degree is None else min(int(sh_degree), model.sh_degree)
    dev = device if device is not None else model.means.device
    return get_rasterize()(
        model.means,
        model.quats,
        model.scales,
        model.opacities,
        model.colors(d),  # [N, (d+1)^2, 3]
        frame.viewmat.to(dev),
        frame.K.to(dev),
        int(frame.width),
        int(frame.height),
        near=near,
        far=far,
        background=None if background is None else background.to(dev),
        sh_degree=d,
        backend=backend,
    )


def normalized_normals(normal: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Unit normals where alpha > 0, zero elsewhere. normal [H, W, 3], alpha [H, W]."""
    n = normal / normal.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.where((alpha > 0)[..., None], n, torch.zeros_like(n))


# ------------------------------------------------------------ loading a run
def load_run(model_dir, data: Optional[str] = None, overrides=()):
    """(model, cfg, scene) of a training output folder.

    The model comes from ``point_cloud.ply`` (written at the end of training)
    or, for an unfinished run, from the newest checkpoint.  ``data`` replaces
    the data folder recorded in ``config.yaml``.  A model with no surfels is
    a SplatInputError naming its file.
    """
    from .data import load_scene_from_config
    from .model import GaussianModel, load_ply
    from .checkpoint import load_latest_checkpoint, read_run_file
    from .config import load_config

    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.yaml"
    if not cfg_path.is_file():
        raise SplatInputError(f"{cfg_path}: not found (is {model_dir} a training output folder?)")
    cfg = load_config(str(cfg_path), overrides)
    if data is not None:
        cfg["data"]["path"] = str(data)
    ply = model_dir / "point_cloud.ply"
    if ply.is_file():
        model, source = load_ply(ply), ply
    else:
        run = read_run_file(model_dir)
        ckpt = load_latest_checkpoint(model_dir, run["run_id"] if run else None)
        if ckpt is None:
            raise SplatInputError(f"{model_dir}: neither point_cloud.ply nor a readable checkpoint of this run")
        model, source = GaussianModel(ckpt["params"], ckpt["sh_degree"]), ckpt["path"]
    if model.num_gaussians == 0:
        # An error, not a warning: every image would be the background alone
        # and a mesh empty, which is no use and easy to mistake for a result.
        raise SplatInputError(f"{source}: the model has no surfels: nothing to render")
    scene = load_scene_from_config(cfg["data"])
    return model, cfg, scene


def _render_outputs(model, cfg, frame):
    """(rgb uint8 [H,W,3], depth [H,W], normal [H,W,3], alpha [H,W]) as numpy float32."""
    r = cfg["render"]
    bg = torch.tensor(cfg["data"]["background"], dtype=torch.float32)
    with torch.no_grad():
        out = render_frame(model, frame, bg, backend=r["backend"], near=r["near"], far=r["far"])
    alpha = out.alpha.detach().cpu().float()
    depth = (out.median_depth if r["depth"] == "median" else out.depth).detach().cpu().float()
    depth = torch.where(alpha > 0, depth, torch.zeros_like(depth))
    normal = normalized_normals(out.normal.detach().cpu().float(), alpha)
    rgb = (out.rgb.detach().cpu().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8)
    return rgb.numpy(), depth.numpy(), normal.numpy(), alpha.numpy()


def render_split(model_dir, data: Optional[str] = None, split: str = "test", overrides=(),
                 progress="auto") -> Path:
    """Write rgb/depth/normal/alpha for every view of ``split``; returns the folder.

    ``progress``: ``"auto"`` (a tqdm bar only when stderr is a terminal),
    True or False (:func:`splat.progress.use_progress_bar`)."""
    from PIL import Image

    model, cfg, scene = load_run(model_dir, data, overrides)
    frames = {"test": scene.test, "train": scene.train}[split]
    root = Path(model_dir) / "renders" / split
    for sub in ("rgb", "depth", "normal", "alpha"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    it = frames
    if use_progress_bar(progress):
        from tqdm import tqdm

        it = tqdm(frames, desc=f"render {split}", dynamic_ncols=True)
    for f in it:
        rgb, depth, normal, alpha = _render_outputs(model, cfg, f)
        Image.fromarray(rgb).save(root / "rgb" / f"{f.stem}.png")
        np.save(root / "depth" / f"{f.stem}.npy", depth.astype(np.float32))
        np.save(root / "normal" / f"{f.stem}.npy", normal.astype(np.float32))
        np.save(root / "alpha" / f"{f.stem}.npy", alpha.astype(np.float32))
    print(f"wrote {len(frames)} {split} views to {root}", file=sys.stderr)
    return root


class MissingOpen3D(RuntimeError):
    pass


def _import_open3d():
    try:
        import open3d as o3d  # noqa: F401
    except ImportError as e:
        raise MissingOpen3D(
            f"--mesh needs open3d, which is not installed ({e}): pip install open3d"
        ) from e
    return o3d


def _depth_points(depth: np.ndarray, K: np.ndarray, viewmat: np.ndarray) -> np.ndarray:
    """World points of the pixels with depth > 0. depth [H, W] -> [M, 3]"""
    from .model import camera_to_world, pixel_rays

    valid = (depth > 0).reshape(-1)
    rays = pixel_rays(torch.from_numpy(K), *depth.shape)[torch.from_numpy(valid)]  # [M, 3]
    cam = rays * torch.from_numpy(depth.reshape(-1)[valid]).to(rays.dtype)[:, None]
    return camera_to_world(torch.from_numpy(viewmat), cam).numpy()


def extract_mesh(
    model_dir, data: Optional[str] = None, mesh_res: int = 1024, alpha_min: float = 0.5, overrides=(),
    progress="auto",
) -> Path:
    """TSDF-fuse the rendered depth of all train views into ``OUT/mesh.ply`` (see module doc)."""
    o3d = _import_open3d()
    model, cfg, scene = load_run(model_dir, data, overrides)
    depth_trunc = 2.0 * float(scene.scene_radius())
    voxel = depth_trunc / float(mesh_res)
    frames = scene.train
    it = frames
    if use_progress_bar(progress):
        from tqdm import tqdm

        it = tqdm(frames, desc="render for tsdf", dynamic_ncols=True)
    views = []  # (rgbd image, intrinsic, extrinsic [4, 4] float64, depth points)
    for f in it:
        rgb, depth, _, alpha = _render_outputs(model, cfg, f)
        depth = np.where(alpha >= alpha_min, depth, 0.0).astype(np.float32)
        depth = np.where(depth < depth_trunc, depth, 0.0).astype(np.float32)
        rgbd = o3d.geometry.RGBDImage.create_from_color_and_depth(
            o3d.geometry.Image(np.ascontiguousarray(rgb)),
            o3d.geometry.Image(np.ascontiguousarray(depth)),
            depth_scale=1.0,
            depth_trunc=depth_trunc,
            convert_rgb_to_intensity=False,
        )
        K = f.K.double().numpy()
        # open3d puts pixel centres at integer coordinates, splat at j + 0.5.
        intr = o3d.camera.PinholeCameraIntrinsic(
            int(f.width), int(f.height), K[0, 0], K[1, 1], K[0, 2] - 0.5, K[1, 2] - 0.5
        )
        V = np.ascontiguousarray(f.viewmat.double().numpy())
        views.append((rgbd, intr, V, _depth_points(depth, K, V)))

    def fuse(volume):
        for rgbd, intr, V, _ in views:
            volume.integrate(rgbd, intr, V)
        return volume.extract_triangle_mesh()

    color = o3d.pipelines.integration.TSDFVolumeColorType.RGB8
    mesh = fuse(o3d.pipelines.integration.ScalableTSDFVolume(
        voxel_length=voxel, sdf_trunc=5.0 * voxel, color_type=color))
    how = f"ScalableTSDFVolume, voxel {voxel:.4g}, sdf_trunc {5 * voxel:.4g}, depth_trunc {depth_trunc:.4g}"
    if len(mesh.vertices) == 0:
        # Some open3d builds (seen: open3d-cpu 0.20 wheel) return an empty
        # mesh from ScalableTSDFVolume.  Fall back to a UniformTSDFVolume over
        # the bounding cube of the fused depth points, at most 384^3 voxels.
        pts = np.concatenate([v[3] for v in views]) if views else np.zeros((0, 3))
        if len(pts):
            lo, hi = np.percentile(pts, 0.5, axis=0), np.percentile(pts, 99.5, axis=0)
            length = float((hi - lo).max()) * 1.1 + 1e-6
            res = int(min(mesh_res, 384))
            vox = length / res
            origin = (lo + hi) / 2 - length / 2
            print(f"warning: ScalableTSDFVolume gave an empty mesh; retrying with UniformTSDFVolume "
                  f"({res}^3 voxels of {vox:.4g})", file=sys.stderr)
            mesh = fuse(o3d.pipelines.integration.UniformTSDFVolume(
                length=length, resolution=res, sdf_trunc=5.0 * vox, color_type=color,
                origin=origin.astype(np.float64)))
            how = f"UniformTSDFVolume fallback, voxel {vox:.4g}, sdf_trunc {5 * vox:.4g}"
    path = Path(model_dir) / "mesh.ply"
    o3d.io.write_triangle_mesh(str(path), mesh)
    print(f"wrote {path}: {len(mesh.vertices)} vertices, {len(mesh.triangles)} triangles ({how})", file=sys.stderr)
    return path


# ---------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Render a trained splat model (images, depth, normals) or fuse a TSDF mesh.",
    )
    p.add_argument("--model", required=True, help="training output folder (holds config.yaml)")
    p.add_argument("--data", default=None, help="scene folder (default: the one in OUT/config.yaml)")
    p.add_argument("--split", choices=("test", "train"), default=None,
                   help="views to render (default: test, unless only --mesh is asked)")
    p.add_argument("--mesh", action="store_true", help="TSDF-fuse train-view depth into OUT/mesh.ply (needs open3d)")
    p.add_argument("--mesh-res", type=int, default=1024, help="voxels across 2 x scene radius (default 1024)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_const", const=True, default="auto",
                     help="force the progress bar (default: only when stderr is a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                     help="never draw the progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. render.depth=expected")
    return p


def main(argv=None) -> int:
    """CLI entry: mistakes print one line ``error: ...`` (exit 1; 2 for bad
    flags or missing open3d), ``--debug`` shows tracebacks instead."""
    args = build_parser().parse_intermixed_args(argv)  # key=value may stand between flags
    progress = args.progress
    if args.mesh:
        try:
            _import_open3d()
        except MissingOpen3D as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from .data import DataError
    from .errors import run_cli

    def run() -> int:
        if args.split is not None or not args.mesh:
            render_split(args.model, args.data, args.split or "test", args.overrides, progress)
        if args.mesh:
            extract_mesh(args.model, args.data, args.mesh_res, overrides=args.overrides, progress=progress)
        return 0

    return run_cli(run, debug=args.debug, extra=(DataError,))
