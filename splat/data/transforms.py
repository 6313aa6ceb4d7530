"""nerfstudio / instant-ngp ``transforms.json`` (one file) -> :class:`SceneData`.

The format most capture apps and tools write (nerfstudio's
``ns-process-data``, instant-ngp's ``colmap2nerf.py``, Polycam, Record3D,
...)::

    <scene>/transforms.json
    <scene>/<frames[i].file_path>          relative to the json's folder
    <scene>/<frames[i].mask_path>          optional, white = keep
    <scene>/<ply_file_path>                optional initial points (nerfstudio)

Keys, per frame or at the top level (per frame wins, group by group: a frame
that holds any key of ``fl_x fl_y camera_angle_x camera_angle_y`` takes its
focal length wholly from itself, ignoring the top level's; likewise ``cx
cy``, and ``k1 k2 k3 k4 p1 p2``; ``camera_model``, ``w`` and ``h`` each on
their own; see :data:`splat.data.nerf.CAMERA_KEY_GROUPS`):

* intrinsics ``fl_x`` [``fl_y``] [``cx`` ``cy``] [``w`` ``h``], in pixels of
  the full-size image with the top-left pixel centre at (0.5, 0.5), as COLMAP
  (``fl_y`` defaults to ``fl_x``, ``cx, cy`` to the image centre); or
  ``camera_angle_x`` [``camera_angle_y``] (field of view, radians; ``fl_x``
  beats ``camera_angle_x`` within one level);
* ``camera_model``: ``PINHOLE`` / ``SIMPLE_PINHOLE``, ``OPENCV`` (``k1 k2
  p1 p2``, and ``k3`` -> COLMAP's ``FULL_OPENCV``), ``OPENCV_FISHEYE`` (``k1 k2
  k3 k4``).  Without ``camera_model`` (instant-ngp), nonzero ``k1 k2 k3 p1
  p2`` mean ``OPENCV``.  nerfstudio's ``k4`` of the ``OPENCV`` model (an r^8
  term OpenCV does not have) must be 0.  Distorted cameras are undistorted at
  load (:mod:`splat.data.undistort`).
* ``transform_matrix``: camera -> world, OpenGL axes (x right, y up, the
  camera looks along -z), converted to splat's OpenCV world -> camera at this
  edge by :func:`splat.data.nerf.opengl_c2w_to_viewmat`.

Every numeric key must be a json number: ``true``/``false`` (which Python
takes as 1/0) and strings are refused, naming the key.

Split: with ``train_filenames`` and ``test_filenames`` (``val_filenames``
when there is no test list; an empty list is allowed for the test split),
the frames are matched against ``file_path``; frames in neither list are
not used.  One list without the other is refused (as nerfstudio does): the
frames it does not name would silently drop out.  Without lists, frames are
sorted by ``file_path`` and every ``test_every``-th (index 0, 8, 16, ...) is
held out; zero training frames (one frame, ``test_every=8``) is refused with
the hint ``data.test_every=0``.

Test images must not leak into training, so these are refused (a
:class:`~splat.data.types.DataError` naming the file and the image): two
frames using the same image (a duplicated frame: even identical copies could
land one in each split, and copies may disagree on the pose), and a name in
both split lists, or twice in one.

Masks (``mask_path``, white = keep; ``masks`` argument): ``"none"`` ignores
them; ``"background"`` composites the image over the background colour with
the mask as alpha (masked-out pixels become background, ``Frame.mask`` is
the mask); ``"ignore"`` keeps the image and sets ``Frame.loss_mask``
(masked-out pixels are left out of the photometric loss).  Whenever a mask
is read its weights are also kept as ``Frame.object_mask``; ``eval_masks``
reads the test frames' masks under ``"none"`` too, for the masked test
metrics (``eval.masked``), leaving images and training untouched.  A mask file is
read by :func:`splat.data.types.read_mask`, by this rule (first match wins):

1. an alpha channel (RGBA, LA, PA, or a transparency key) that is not the
   same everywhere is the mask, whatever the colour channels hold (a
   background remover's cut-out, an object in alpha over black RGB);
2. a palette (``P``) image is a label map: index 0 is background (0), every
   other index is foreground (1), whatever its colour (DAVIS / VOC-style
   masks, index 1 drawn red);
3. otherwise the largest of the colour channels (grey for a greyscale mask;
   any colour on black counts as kept) scaled by the bit depth's full value:
   255 (8-bit), 65535 (16-bit), 1 (float).

In cases 1 and 3 an integer (8- or 16-bit) mask that never reaches white is
a label map when it holds only 0 and 1, or 0 and at most 15 other values
(0/2, object ids 1..n: a segmentation output): 0 -> 0, every nonzero label
-> 1 (not 2/255).  Any other mask (one reaching white, or with more grey
levels: a soft matte) is alpha, its value over the full value.
A mask that nowhere exceeds 1/255 (all black, or empty) would blank the
whole image (``background``) or train on nothing (``ignore``): it is refused
with a ``DataError`` naming the mask file.  Masks are then undistorted like
their image and area-averaged with it when downscaling.

``ply_file_path``: initial points.  A PLY with 0 points is treated as no
point cloud (``SceneData.points`` is None, so the trainer's other
initialisations are used), with a one-line warning on stderr naming it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from .nerf import CameraKeys, _read_json, _transform, opengl_c2w_to_viewmat, pinhole_intrinsics, resolve_unique_image
from .types import (
    BackgroundLike,
    DataError,
    Frame,
    SceneData,
    area_downscale,
    check_intrinsics,
    check_points,
    check_pose,
    first_repeat,
    holdout_split,
    image_size,
    parse_background,
    read_mask,
    scaled_K,
)
from .undistort import LensCamera, default_cache_dir, load_camera_image

__all__ = ["MASK_MODES", "load_transforms", "lens_camera_from_json"]

MASK_MODES = ("none", "background", "ignore")
_PINHOLE_NAMES = ("PINHOLE", "SIMPLE_PINHOLE")


def lens_camera_from_json(json_path: Path, where: str, meta: dict, frame: dict, W: int, H: int) -> LensCamera:
    """The :class:`LensCamera` of one frame (``W x H``: the image file's size)."""
    keys = CameraKeys(json_path, where, meta, frame)
    fx, fy, cx, cy = pinhole_intrinsics(keys, W, H)
    k = {key: (keys.number(key) or 0.0) for key in ("k1", "k2", "k3", "k4", "p1", "p2")}

    model = keys.raw("camera_model")
    if model is None:
        model = "OPENCV" if any(k[x] != 0.0 for x in ("k1", "k2", "k3", "p1", "p2")) else "PINHOLE"
    if not isinstance(model, str):
        raise DataError(f"{json_path}: {where}: 'camera_model' must be a string, got {model!r}")
    if model in _PINHOLE_NAMES:
        bad = [x for x, v in k.items() if v != 0.0]
        if bad:
            raise DataError(
                f"{json_path}: {where}: camera_model {model} with nonzero distortion {bad[0]}="
                f"{k[bad[0]]}; use camera_model OPENCV"
            )
        return LensCamera("PINHOLE", W, H, (fx, fy, cx, cy))
    if model == "OPENCV":
        if k["k4"] != 0.0:
            raise DataError(
                f"{json_path}: {where}: k4={k['k4']} (nerfstudio's r^8 term) is not supported for camera_model OPENCV"
            )
        if k["k3"] != 0.0:
            return LensCamera(
                "FULL_OPENCV", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"], k["k3"], 0.0, 0.0, 0.0)
            )
        return LensCamera("OPENCV", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"]))
    if model == "OPENCV_FISHEYE":
        if k["p1"] != 0.0 or k["p2"] != 0.0:
            raise DataError(f"{json_path}: {where}: camera_model OPENCV_FISHEYE has no p1/p2")
        return LensCamera("OPENCV_FISHEYE", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["k3"], k["k4"]))
    raise DataError(
        f"{json_path}: {where}: camera_model {model!r} is not supported "
        "(supported: PINHOLE, SIMPLE_PINHOLE, OPENCV, OPENCV_FISHEYE)"
    )


def _read_ply_points(path: Path) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(xyz [M, 3], rgb [M, 3] in [0, 1])`` of a point-cloud PLY (grey when it
    has no colours); ``(None, None)``, with a warning, when it has no points."""
    from plyfile import PlyData

    try:
        v = PlyData.read(str(path))["vertex"]
        xyz = np.stack([np.asarray(v[c], np.float64) for c in ("x", "y", "z")], 1).reshape(-1, 3)
        names = v.data.dtype.names
        if all(c in names for c in ("red", "green", "blue")):
            rgb = np.stack([np.asarray(v[c], np.float64) for c in ("red", "green", "blue")], 1) / 255.0
        else:
            rgb = np.full_like(xyz, 0.5)
    except Exception as e:  # plyfile raises many types for bad files
        raise DataError(f"{path}: cannot read point cloud ({type(e).__name__}: {e})") from e
    if len(xyz) == 0:
        # What a failed triangulation leaves behind: train as if there were no
        # point cloud (the other initialisations), but say so.
        print(f"warning: {path}: point cloud has 0 points; initialising without it", file=sys.stderr)
        return None, None
    check_points(str(path), xyz)
    return torch.from_numpy(xyz).float(), torch.from_numpy(np.clip(rgb, 0, 1)).float()


def _norm(p: str) -> str:
    return os.path.normpath(p).replace("\\", "/")


def _split(json_path: Path, meta: dict, paths: list[str], test_every: int) -> tuple[list[int], list[int]]:
    """Indices (into name-sorted ``paths``) of (train, test); see the module docstring."""
    use_val = meta.get("test_filenames") is None and meta.get("val_filenames") is not None
    test_key = "val_filenames" if use_val else "test_filenames"
    lists = {"train_filenames": meta.get("train_filenames"), test_key: meta.get(test_key)}
    if all(lst is None for lst in lists.values()):
        return holdout_split(str(json_path), len(paths), test_every)
    for key, lst in lists.items():
        if lst is None:
            have = next(k for k in lists if k != key)
            raise DataError(
                f"{json_path}: '{have}' without '{key}': the frames in neither list would be silently "
                "left out; give both lists (an empty one for no test split), or neither (then every "
                "data.test_every-th frame is a test view)"
            )
        if not isinstance(lst, list) or not all(isinstance(x, str) for x in lst):
            raise DataError(f"{json_path}: '{key}' must be a list of file paths")
    index = {_norm(p): i for i, p in enumerate(paths)}
    picked = {}
    for key, lst in lists.items():
        for p in lst:
            if _norm(p) not in index:
                raise DataError(f"{json_path}: {key} names {p!r}, which is no frame's file_path")
        picked[key] = [index[_norm(p)] for p in lst]
    train, test = picked.values()
    twice = first_repeat(train + test)
    if twice is not None:
        keys = " and ".join(f"'{k}'" for k, v in picked.items() if twice in v)
        raise DataError(
            f"{json_path}: {paths[twice]!r} is named twice, in {keys}: a view must be in one split "
            "once (a test image that is also trained on inflates the test metrics)"
        )
    if not train:
        raise DataError(f"{json_path}: 'train_filenames' is empty: zero training frames")
    return train, test


def _mask_for_undistortion(m: np.ndarray, cache_dir) -> Path:
    """Mask weights ``m`` (``[H, W]`` in [0, 1]) as a 16-bit grey PNG in the
    cache, named by its content: the undistorter reads a mask as a plain grey
    image, so it is handed the weights :func:`read_mask` decided on, not the
    raw file (a palette, 0/1 labels or an alpha channel would read wrong)."""
    from io import BytesIO

    from PIL import Image

    from ..run_folder import atomic_write_bytes

    q = np.round(m * 65535.0).astype(np.uint16)  # [H, W]
    name = hashlib.sha256(f"{q.shape}".encode() + q.tobytes()).hexdigest()[:32]
    out = Path(cache_dir or default_cache_dir()) / "masks" / f"{name}.png"
    if not out.is_file():
        buf = BytesIO()
        Image.fromarray(q).save(buf, format="PNG")
        try:
            atomic_write_bytes(out, buf.getvalue())
        except OSError as e:
            raise DataError(
                f"{out}: cannot write the mask cache ({e}); set SPLAT_CACHE_DIR or data.cache_dir to a writable folder"
            ) from e
    return out


def load_mask(
    path: Path, cam: LensCamera, downscale: int, cache_dir: Optional[Union[str, Path]] = None, blank_pixels: float = 0.0
) -> torch.Tensor:
    """``[h, w]`` weights of mask file ``path`` for an image of camera ``cam``:
    read by :func:`splat.data.types.read_mask` (see the module docstring),
    then undistorted and area-averaged like the image."""
    m = read_mask(path)  # [H, W]
    if cam.is_pinhole:
        return area_downscale(torch.from_numpy(m)[..., None], downscale)[..., 0].contiguous()
    grey = _mask_for_undistortion(m, cache_dir)
    img, _, _ = load_camera_image(grey, cam, downscale, torch.zeros(3), cache_dir, blank_pixels, kind="mask")
    return img[..., 0].contiguous()  # blank (outside the source) pixels are 0


def load_transforms(
    path: Path,
    downscale: int = 1,
    background: BackgroundLike = (1.0, 1.0, 1.0),
    test_every: int = 8,
    masks: str = "none",
    cache_dir: Optional[Union[str, Path]] = None,
    blank_pixels: float = 0.0,
    eval_masks: bool = False,
) -> SceneData:
    """Load a folder with one ``transforms.json`` (see the module docstring).

    ``eval_masks``: read the test frames' ``mask_path`` into
    ``Frame.object_mask`` even when ``masks`` is ``"none"``.

    Raises:
        DataError: missing/invalid json, keys, images, masks (empty ones
            included) or point cloud; a frame named twice; a split that
            names a frame twice, leaves frames out or trains on nothing.
    """
    if masks not in MASK_MODES:
        raise ValueError(f"masks must be one of {MASK_MODES}, got {masks!r}")
    root = Path(path)
    json_path = root / "transforms.json"
    meta = _read_json(json_path)
    bg = parse_background(background)
    raw = meta["frames"]
    if not raw:
        raise DataError(f"{json_path}: 'frames' is empty: zero usable cameras")
    for i, fr in enumerate(raw):
        if not isinstance(fr, dict):
            raise DataError(f"{json_path}: frames[{i}] must be a json object")
        if not isinstance(fr.get("file_path"), str):
            raise DataError(f"{json_path}: frames[{i}]: missing key 'file_path'")
        if (masks != "none" or eval_masks) and "mask_path" in fr and not isinstance(fr["mask_path"], str):
            raise DataError(f"{json_path}: frames[{i}]: 'mask_path' must be a file path, got {fr['mask_path']!r}")
    order = sorted(range(len(raw)), key=lambda i: raw[i]["file_path"])
    seen: dict = {}
    ipaths = [resolve_unique_image(json_path, f"frames[{i}]", raw[i]["file_path"], seen) for i in order]
    train_idx, test_idx = _split(json_path, meta, [raw[i]["file_path"] for i in order], test_every)
    test_set = set(test_idx)

    def load(k: int) -> Frame:
        i, ipath = order[k], ipaths[k]
        fr, where = raw[i], f"frames[{i}]"
        c2w = _transform(json_path, where, fr)
        W, H = image_size(ipath)
        cam = lens_camera_from_json(json_path, where, meta, fr, W, H)
        check_intrinsics(f"{json_path}: {where}", *cam.fxfycxcy())
        img, alpha, (fx, fy, cx, cy) = load_camera_image(
            ipath, cam, downscale, bg, cache_dir, blank_pixels, camera_name=f"{json_path.name}: {where}"
        )
        loss_mask = m = None
        if (masks != "none" or (eval_masks and k in test_set)) and "mask_path" in fr:
            mpath = json_path.parent / fr["mask_path"]
            if not mpath.is_file():
                raise DataError(f"{mpath}: mask file not found (named by {json_path}, {where})")
            mW, mH = image_size(mpath)
            if (mW, mH) != (W, H):
                raise DataError(f"{mpath}: mask is {mW}x{mH} but its image {ipath.name} is {W}x{H}")
            m = load_mask(mpath, cam, downscale, cache_dir, blank_pixels)  # [h, w]
            if masks == "background":
                img = img * m[..., None] + bg.view(1, 1, 3) * (1.0 - m[..., None])
                alpha = m if alpha is None else alpha * m
            elif masks == "ignore":
                loss_mask = m
        return Frame(
            stem=ipath.stem,
            image_path=ipath,
            image=img.contiguous(),
            mask=alpha,
            viewmat=check_pose(f"{json_path}: {where}", opengl_c2w_to_viewmat(c2w)),
            K=scaled_K(fx, fy, cx, cy, downscale),
            width=img.shape[1],
            height=img.shape[0],
            loss_mask=loss_mask,
            object_mask=m,
        )

    # Frames in no split list are not decoded (nor checked beyond their file's existence).
    frames = {k: load(k) for k in sorted(set(train_idx) | set(test_idx))}
    points = colors = None
    if meta.get("ply_file_path") is not None:
        if not isinstance(meta["ply_file_path"], str):
            raise DataError(f"{json_path}: 'ply_file_path' must be a file path, got {meta['ply_file_path']!r}")
        ply = json_path.parent / meta["ply_file_path"]
        if not ply.is_file():
            raise DataError(f"{ply}: point cloud not found (ply_file_path in {json_path})")
        points, colors = _read_ply_points(ply)
    return SceneData(
        train=[frames[k] for k in train_idx],
        test=[frames[k] for k in test_idx],
        points=points,
        point_colors=colors,
        layout="transforms",
    )
