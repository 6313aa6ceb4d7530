"""A trained run's mesh, as ``render.py --mesh`` / ``--unbounded`` writes it.

Bounded (``OUT/mesh.ply``), with 2DGS's defaults:
``depth_trunc = 2 * scene_radius`` (anything farther is background),
``voxel = depth_trunc / mesh_res`` (``mesh_res`` 1024), ``sdf_trunc = 5 voxel``;
then the clean-up of :mod:`splat.mesh.cleanup` (unseen surfaces, small
clusters).  Unbounded (``OUT/mesh_unbounded.ply``): :mod:`splat.mesh.unbounded`
over the whole scene, the same clean-up, and vertex colours from the views.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from ..errors import SplatInputError
from .budget import bounded_tsdf_bytes, check_fits, unbounded_tsdf_bytes
from .cleanup import keep_large_clusters, remove_unseen
from .open3d_import import import_open3d
from .tsdf import fuse_tsdf
from .unbounded import TRUNC_VOXELS, contract, contracted_extent, extract_unbounded, radial_stretch
from .views import FusionView, render_fusion_views

if TYPE_CHECKING:
    import open3d

#: Unseen-surface tolerance (cleanup.py), in voxels: above the fusion's own
#: scatter (at most a voxel on tests/test_mesh.py's sphere).  On still_life's
#: fast model (docs/results.md) 1 to 2.5 voxels change F1 by 0.001 and the
#: unseen share by 0.6 points.
UNSEEN_TOLERANCE_VOXELS = 1.5


@dataclass
class MeshOptions:
    """What ``render.py`` exposes as flags.

    Attributes:
        mesh_res: bounded: voxels across ``depth_trunc``; unbounded: samples per
            edge of the contracted grid.
        depth_ratio: 0 fuses the expected depth, 1 the median (views.py);
            None: 1 for unbounded scenes, else the run's ``render.depth``
            (expected -> 0, median -> 1).
        alpha_min: pixels with lower alpha are not fused.
        depth_trunc: bounded only; None = 2 x scene radius.
        keep_unseen: keep surfaces no view sees (cleanup.py).
        max_clusters: keep this many largest connected clusters (0 = all).
        min_cluster_triangles: drop clusters smaller than this.
    """

    mesh_res: int = 1024
    depth_ratio: Optional[float] = None
    alpha_min: float = 0.5
    depth_trunc: Optional[float] = None
    keep_unseen: bool = False
    max_clusters: int = 50
    min_cluster_triangles: int = 50


def _depth_ratio(options: MeshOptions, cfg, unbounded: bool) -> float:
    """The flag; else the median for unbounded scenes, where the expected depth
    of a pixel on a depth edge mixes foreground and a far background into
    sheets in free space (tests/test_mesh.py measures it); else the run's
    ``render.depth``."""
    if options.depth_ratio is not None:
        return float(options.depth_ratio)
    if unbounded:
        return 1.0
    return 1.0 if cfg["render"]["depth"] == "median" else 0.0


def default_depth_trunc(views: Sequence[FusionView], radius: float) -> float:
    """2DGS's ``2 x scene_radius``, unless that drops most of what the views
    measured.  Cameras that span little compared with their distance to the
    subject (an arc, a forward-facing capture) give a small radius, and that
    rule would cut the subject itself: then the 95th percentile of the
    measured depths, plus 5 %, and a warning saying so."""
    depths = np.concatenate([v.depth[v.depth > 0] for v in views]) if views else np.zeros(0)
    trunc = 2.0 * radius
    if len(depths) and (depths <= trunc).mean() < 0.5:
        chosen = float(np.quantile(depths, 0.95)) * 1.05
        print(
            f"warning: depth_trunc = 2 x scene radius ({trunc:.4g}) would drop "
            f"{100 * (depths > trunc).mean():.0f} % of the measured depth; using {chosen:.4g} "
            f"(set --depth-trunc to choose)",
            file=sys.stderr,
        )
        return chosen
    return trunc


def _clean(mesh, views, tolerance, options: MeshOptions, recolor: bool):
    """Unseen-surface removal and cluster filtering; returns (mesh, notes)."""
    notes = []
    if not options.keep_unseen:
        mesh, removed = remove_unseen(mesh, views, tolerance, recolor=recolor)
        notes.append(f"{100 * removed:.1f} % of the area unseen and removed")
    mesh, kept = keep_large_clusters(
        mesh, options.min_cluster_triangles, options.max_clusters if options.max_clusters > 0 else None
    )
    notes.append(f"{kept} clusters kept")
    return mesh, notes


def check_options(options: MeshOptions) -> None:
    """Refuses settings no mesh can come from, naming the ``render.py`` flag."""
    if options.mesh_res < 8:
        raise ValueError(f"--mesh-res: {options.mesh_res} is below 8")
    if options.depth_trunc is not None and not (math.isfinite(options.depth_trunc) and options.depth_trunc > 0):
        raise ValueError(f"--depth-trunc: {options.depth_trunc} is not a finite number > 0")
    if not 0.0 <= options.alpha_min < 1.0:
        raise ValueError(f"--alpha-min: {options.alpha_min} is not in [0, 1)")


def _why_empty(views, alpha_min: float, depth_trunc: Optional[float], notes) -> str:
    """Why a fusion gave no triangles, for the error line."""
    measured = sum(int((v.depth > 0).sum()) for v in views)
    if measured == 0:
        return f"no pixel of the {len(views)} train views reaches alpha {alpha_min:g} (--alpha-min)"
    if depth_trunc is not None:
        within = sum(int(((v.depth > 0) & (v.depth <= depth_trunc)).sum()) for v in views)
        if within == 0:
            nearest = min(float(v.depth[v.depth > 0].min()) for v in views if (v.depth > 0).any())
            return (
                f"every measured depth lies beyond depth_trunc {depth_trunc:.4g} (--depth-trunc; "
                f"the nearest is {nearest:.4g})"
            )
    return (
        f"{measured} pixels were fused but no surface survived ({'; '.join(notes) or 'no clean-up'}); "
        "try a finer --mesh-res, --keep-unseen or --keep-clusters 0"
    )


def write_mesh(o3d: Any, mesh: open3d.geometry.TriangleMesh, path: Path) -> None:
    """Writes ``mesh`` to ``path`` atomically: beside it first, then renamed,
    so that a killed write leaves the previous file (or none), never a
    truncated one.  A failed write is an OSError naming the file."""
    path = Path(path)
    folder = path.parent
    for old in folder.glob(f".{path.name}.tmp*.ply"):  # left by a killed writer
        pid = old.name[len(path.name) + 5 : -4]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            old.unlink(missing_ok=True)
    if not os.access(folder, os.W_OK):
        raise OSError(f"{folder}: cannot write {path.name} there (no write permission)")
    tmp = folder / f".{path.name}.tmp{os.getpid()}.ply"  # open3d picks the format by the extension
    try:
        if not o3d.io.write_triangle_mesh(str(tmp), mesh) or not tmp.is_file():
            raise OSError(f"{path}: open3d could not write the mesh (disk full or not writable?)")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def extract_mesh(
    model_dir: str | Path,
    data: Optional[str] = None,
    overrides: Sequence[str] = (),
    unbounded: bool = False,
    options: Optional[MeshOptions] = None,
    progress: bool | str = "auto",
) -> Path:
    """Mesh the run in ``model_dir``; returns the path written (module doc).

    An empty result is an error (:class:`splat.errors.SplatInputError`)
    saying why, and the file is not written; so is a resolution whose
    fusion would not fit in the available memory (:mod:`splat.mesh.budget`)."""
    from ..trained_run import load_run

    o3d = import_open3d()
    options = options or MeshOptions()
    check_options(options)
    if unbounded:
        check_fits(
            unbounded_tsdf_bytes(options.mesh_res),
            f"--mesh-res {options.mesh_res} (--unbounded)",
            "lower --mesh-res (the grid grows with its cube)",
        )
    t0 = time.perf_counter()
    model, cfg, scene = load_run(model_dir, data, overrides)
    views = render_fusion_views(
        model, cfg, scene.train, _depth_ratio(options, cfg, unbounded), options.alpha_min, progress
    )
    radius = float(scene.scene_radius())
    depth_trunc = None
    if unbounded:
        center = torch.stack([f.camera_center for f in scene.train]).double().mean(0)  # [3]
        extent = contracted_extent(model.means.detach().cpu(), center, radius)
        mesh = extract_unbounded(views, center, radius, extent, options.mesh_res, progress)
        h = 2.0 * extent / options.mesh_res
        y = contract((torch.from_numpy(np.asarray(mesh.vertices)) - center) / radius)
        tolerance = (UNSEEN_TOLERANCE_VOXELS * radius * h * radial_stretch(y)).numpy()
        mesh, notes = _clean(mesh, views, tolerance, options, recolor=True)
        how = f"unbounded, {options.mesh_res}^3 contracted samples, R {extent:.3g}, trunc {TRUNC_VOXELS:g} voxels"
        path = Path(model_dir) / "mesh_unbounded.ply"
    else:
        depth_trunc = float(options.depth_trunc) if options.depth_trunc else default_depth_trunc(views, radius)
        voxel = depth_trunc / options.mesh_res
        check_fits(
            bounded_tsdf_bytes(views, voxel, depth_trunc),
            f"--mesh-res {options.mesh_res}",
            "lower --mesh-res (the blocks grow with its square) or --depth-trunc",
        )
        mesh = fuse_tsdf(views, voxel, 5.0 * voxel, depth_trunc, progress)
        mesh, notes = _clean(mesh, views, UNSEEN_TOLERANCE_VOXELS * voxel, options, recolor=False)
        how = f"voxel {voxel:.4g}, sdf_trunc {5 * voxel:.4g}, depth_trunc {depth_trunc:.4g}"
        path = Path(model_dir) / "mesh.ply"
    if len(mesh.triangles) == 0:
        kept = f"; the older {path.name} is left as it was" if path.exists() else ""
        raise SplatInputError(
            f"{path}: not written, the mesh is empty: {_why_empty(views, options.alpha_min, depth_trunc, notes)}{kept}"
        )
    write_mesh(o3d, mesh, path)
    print(
        f"wrote {path}: {len(mesh.vertices)} vertices, {len(mesh.triangles)} triangles ({how}; "
        f"{'; '.join(notes)}) in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return path
