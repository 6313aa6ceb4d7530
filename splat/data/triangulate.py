"""Initial points for a posed scene without a point cloud: COLMAP's point
triangulator (through pycolmap, the optional ``sfm`` extra) on SIFT features
of the training images, with splat's known cameras held fixed.

::

    from splat.data.triangulate import triangulate_scene
    pts, cols = triangulate_scene(scene.train, cache_dir=None)   # [M, 3], [M, 3] in [0, 1]

Steps (COLMAP's "reconstruct sparse model from known camera poses"):

1. the frames' images as loaded (already undistorted and downscaled, so one
   pinhole ``K`` per frame is exact) are written as PNGs to a scratch folder;
2. ``pycolmap.extract_features`` (SIFT) into a scratch database, one camera
   per image;
3. matching: every pair when there are at most ``EXHAUSTIVE_MAX`` images,
   else each image with its ``NEIGHBOURS`` nearest cameras by viewing
   direction and position (``pycolmap.match_image_pairs``);
4. a :class:`pycolmap.Reconstruction` with splat's intrinsics and poses
   (``viewmat`` is world -> camera in OpenCV axes, which is COLMAP's
   ``cam_from_world``), and ``pycolmap.triangulate_points``, which
   triangulates, merges tracks and filters by reprojection error and
   triangulation angle, keeping the poses fixed.

The points are cached as ``<cache>/triangulated/<key>.npz`` (``<cache>`` as
for undistortion, :func:`splat.data.undistort.default_cache_dir`), ``key`` a
digest of the pixels, intrinsics and poses, so a scene is triangulated once.
Entries are written atomically (a killed run leaves no partial file); one
that cannot be read back as two finite ``[M, 3]`` arrays (truncated, not a
zip, missing keys, wrong shapes, NaN, colours outside [0, 1]) is
recomputed with a one-line warning.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .types import DataError
from .undistort import default_cache_dir

__all__ = ["pycolmap_available", "triangulate_scene", "triangulate_frames"]

#: Up to this many images every pair is matched.
EXHAUSTIVE_MAX = 60
#: Beyond that, each image is matched with this many nearest cameras.
NEIGHBOURS = 20
#: Bump when the triangulation or the cache format changes.
_CACHE_VERSION = 1


def pycolmap_available() -> bool:
    try:
        import pycolmap  # noqa: F401
    except ImportError:
        return False
    return True


def _cache_key(frames: Sequence) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION};{EXHAUSTIVE_MAX};{NEIGHBOURS}".encode())
    for f in frames:
        h.update(f"{f.width}x{f.height}".encode())
        for t in (f.image, f.K, f.viewmat):
            h.update(np.ascontiguousarray(t.detach().cpu().numpy()).tobytes())
    return h.hexdigest()[:32]


def _neighbour_pairs(frames: Sequence, k: int) -> list:
    """Image index pairs (i < j): each image with its ``k`` nearest cameras
    by a distance mixing viewing direction (1 - cos) and centre distance
    (relative to the cameras' spread)."""
    V = torch.stack([f.viewmat for f in frames]).double()
    centers = torch.stack([f.camera_center for f in frames]).double()
    fwd = V[:, 2, :3]  # camera z axis in world coordinates
    spread = (centers - centers.mean(0)).norm(dim=1).max().clamp_min(1e-12)
    d = (1.0 - fwd @ fwd.T) + torch.cdist(centers, centers) / spread
    d.fill_diagonal_(float("inf"))
    nn = d.topk(min(k, len(frames) - 1), largest=False).indices
    return sorted({(min(i, int(j)), max(i, int(j))) for i in range(len(frames)) for j in nn[i]})


def _write_png(path: Path, image: torch.Tensor) -> None:
    from PIL import Image

    q = (image.clamp(0, 1).cpu().numpy() * 255.0 + 0.5).astype(np.uint8)
    Image.fromarray(q).save(path)


def triangulate_frames(frames: Sequence, work: Path, verbose: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Triangulate the SIFT features of ``frames`` (fixed cameras) in the
    scratch folder ``work``.  Returns (xyz [M, 3] float64, rgb [M, 3] in [0, 1])."""
    import pycolmap

    if len(frames) < 2:
        return np.zeros((0, 3)), np.zeros((0, 3))
    level = pycolmap.logging.minloglevel
    if not verbose:
        pycolmap.logging.minloglevel = 2  # COLMAP's per-image INFO lines would flood the training log
    try:
        return _triangulate(pycolmap, frames, work, verbose)
    finally:
        pycolmap.logging.minloglevel = level


def _triangulate(pycolmap, frames: Sequence, work: Path, verbose: bool) -> Tuple[np.ndarray, np.ndarray]:
    image_dir, db_path, out_dir = work / "images", work / "database.db", work / "sparse"
    image_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [f"{i:05d}.png" for i in range(len(frames))]
    for name, f in zip(names, frames):
        _write_png(image_dir / name, f.image)

    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = "PINHOLE"
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = min(os.cpu_count() or 1, 8)
    extraction.use_gpu = False
    pycolmap.extract_features(
        db_path,
        image_dir,
        image_names=names,
        camera_mode=pycolmap.CameraMode.PER_IMAGE,
        reader_options=reader,
        extraction_options=extraction,
        device=pycolmap.Device.cpu,
    )

    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = extraction.num_threads
    matching.use_gpu = False
    if len(frames) <= EXHAUSTIVE_MAX:
        pycolmap.match_exhaustive(db_path, matching_options=matching, device=pycolmap.Device.cpu)
    else:
        pairs_file = work / "pairs.txt"
        pairs_file.write_text("".join(f"{names[i]} {names[j]}\n" for i, j in _neighbour_pairs(frames, NEIGHBOURS)))
        pairing = pycolmap.ImportedPairingOptions()
        pairing.match_list_path = str(pairs_file)
        pycolmap.match_image_pairs(
            db_path, matching_options=matching, pairing_options=pairing, device=pycolmap.Device.cpu
        )

    # The reconstruction uses the database's ids, with splat's intrinsics and poses.
    db = pycolmap.Database.open(str(db_path)) if hasattr(pycolmap.Database, "open") else pycolmap.Database(str(db_path))
    try:
        db_images = {im.name: im for im in db.read_all_images()}
        rec = pycolmap.Reconstruction()
        for name, f in zip(names, frames):
            im = db_images[name]
            K = f.K.double()
            cam = pycolmap.Camera(
                model="PINHOLE",
                width=f.width,
                height=f.height,
                params=[float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2])],
                camera_id=im.camera_id,
            )
            db.update_camera(cam)
            rec.add_camera_with_trivial_rig(cam)
            V = f.viewmat.double().cpu().numpy()
            pose = pycolmap.Rigid3d(pycolmap.Rotation3d(V[:3, :3]), V[:3, 3])
            rec.add_image_with_trivial_frame(
                pycolmap.Image(name=name, camera_id=im.camera_id, image_id=im.image_id), pose
            )
    finally:
        db.close()

    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = extraction.num_threads
    rec = pycolmap.triangulate_points(
        rec, db_path, image_dir, out_dir, clear_points=True, options=options, refine_intrinsics=False
    )
    if verbose:
        print(rec.summary())
    pts = rec.points3D
    if len(pts) == 0:
        return np.zeros((0, 3)), np.zeros((0, 3))
    xyz = np.stack([p.xyz for p in pts.values()]).astype(np.float64)
    rgb = np.stack([p.color for p in pts.values()]).astype(np.float64) / 255.0
    return xyz, rgb


def _read_cache(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """``(xyz, rgb)`` of a cache entry; raises on anything but two finite
    float ``[M, 3]`` arrays with colours in [0, 1]."""
    with np.load(path, allow_pickle=False) as z:
        xyz, rgb = z["xyz"], z["rgb"]
    for name, a in (("xyz", xyz), ("rgb", rgb)):
        if a.dtype.kind != "f" or a.ndim != 2 or a.shape != (len(xyz), 3):
            raise ValueError(f"{name} is {a.dtype} {a.shape}, expected float [{len(xyz)}, 3]")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} has non-finite values")
    if rgb.size and (rgb.min() < 0 or rgb.max() > 1):
        raise ValueError("rgb outside [0, 1]")
    return xyz, rgb


def triangulate_scene(
    frames: Sequence, cache_dir: Optional[os.PathLike] = None, verbose: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triangulated points of ``frames`` (see the module doc), cached on disk.

    Returns (points [M, 3] float32, colours [M, 3] float32 in [0, 1]); M may
    be 0 (nothing matched).  Raises ImportError without pycolmap and
    DataError when the cache folder cannot be written."""
    import pycolmap  # noqa: F401  (ImportError before any work)

    from ..run_folder import atomic_write

    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    out = cache / "triangulated" / f"{_cache_key(frames)}.npz"
    if out.is_file():
        try:
            xyz, rgb = _read_cache(out)
            return torch.from_numpy(xyz).float(), torch.from_numpy(rgb).float()
        except Exception as e:  # any failure to read back a disposable entry: recompute it
            print(
                f"warning: corrupt triangulation cache entry {out} ({type(e).__name__}: {e}): recomputing it",
                file=sys.stderr,
            )
    work = Path(tempfile.mkdtemp(prefix="splat_triangulate_"))
    try:
        xyz, rgb = triangulate_frames(frames, work, verbose=verbose)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        atomic_write(out, lambda f: np.savez(f, xyz=xyz.astype(np.float32), rgb=rgb.astype(np.float32)))
    except OSError as e:
        raise DataError(
            f"{out}: cannot write the triangulation cache ({e}); set SPLAT_CACHE_DIR "
            "or data.cache_dir to a writable folder"
        ) from e
    return torch.from_numpy(xyz).float(), torch.from_numpy(rgb).float()
