"""nerfstudio / instant-ngp ``transforms.json`` (one file) -> :class:`SceneData`.

The format most capture apps and tools write (nerfstudio's
``ns-process-data``, instant-ngp's ``colmap2nerf.py``, Polycam, Record3D,
...)::

    <scene>/transforms.json
    <scene>/<frames[i].file_path>          relative to the json's folder
    <scene>/<frames[i].mask_path>          optional, white = keep
    <scene>/<ply_file_path>                optional initial points (nerfstudio)

Keys, per frame or at the top level (per frame wins):

* intrinsics ``fl_x`` [``fl_y``] [``cx`` ``cy``] [``w`` ``h``], in pixels of
  the full-size image with the top-left pixel centre at (0.5, 0.5), as COLMAP
  (``fl_y`` defaults to ``fl_x``, ``cx, cy`` to the image centre); or
  ``camera_angle_x`` [``camera_angle_y``] (field of view, radians);
* ``camera_model``: ``PINHOLE`` / ``SIMPLE_PINHOLE``, ``OPENCV`` (``k1 k2 p1
  p2``, and ``k3`` -> COLMAP's ``FULL_OPENCV``), ``OPENCV_FISHEYE`` (``k1 k2
  k3 k4``).  Without ``camera_model`` (instant-ngp), nonzero ``k1 k2 k3 p1
  p2`` mean ``OPENCV``.  nerfstudio's ``k4`` of the ``OPENCV`` model (an r^8
  term OpenCV does not have) must be 0.  Distorted cameras are undistorted at
  load (:mod:`splat.data.undistort`).
* ``transform_matrix``: camera -> world, OpenGL axes (x right, y up, the
  camera looks along -z), converted to splat's OpenCV world -> camera at this
  edge by :func:`splat.data.nerf.opengl_c2w_to_viewmat`.

Split: ``train_filenames`` / ``test_filenames`` (``val_filenames`` when there
is no test list) where present, matched against ``file_path``; else frames
sorted by ``file_path`` and every ``test_every``-th (index 0, 8, 16, ...)
held out.

Masks (``mask_path``; ``masks`` argument): ``"none"`` ignores them;
``"background"`` composites the image over the background colour with the
mask as alpha (masked-out pixels become background, ``Frame.mask`` is the
mask); ``"ignore"`` keeps the image and sets ``Frame.loss_mask`` (masked-out
pixels are left out of the photometric loss).  Masks are area-averaged with
the image when downscaling, and undistorted like it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .nerf import _get_float, _read_json, _resolve_image, _transform, opengl_c2w_to_viewmat
from .types import (DataError, Frame, SceneData, check_intrinsics, check_points, check_pose, image_size,
                    parse_background, scaled_K)
from .undistort import LensCamera, load_camera_image

__all__ = ["MASK_MODES", "load_transforms", "lens_camera_from_json"]

MASK_MODES = ("none", "background", "ignore")
_PINHOLE_NAMES = ("PINHOLE", "SIMPLE_PINHOLE")


def lens_camera_from_json(json_path: Path, where: str, meta: dict, frame: dict, W: int, H: int) -> LensCamera:
    """The :class:`LensCamera` of one frame (``W x H``: the image file's size)."""

    def get(key: str) -> Optional[float]:
        v = _get_float(json_path, where, frame, key)
        return v if v is not None else _get_float(json_path, "top level", meta, key)

    w, h = get("w"), get("h")
    if (w is not None and int(round(w)) != W) or (h is not None and int(round(h)) != H):
        raise DataError(
            f"{json_path}: {where}: the json says the image is {w:g}x{h:g} but the image file is {W}x{H} "
            "(size mismatch; resized images need matching intrinsics)"
        )
    fx, fy = get("fl_x"), get("fl_y")
    if fx is None and fy is None:
        for key, n, store in (("camera_angle_x", W, "x"), ("camera_angle_y", H, "y")):
            a = get(key)
            if a is None:
                continue
            if not 0.0 < a < math.pi:
                raise DataError(f"{json_path}: {where}: {key}={a} is not in (0, pi) radians")
            if store == "x":
                fx = 0.5 * n / math.tan(0.5 * a)
            else:
                fy = 0.5 * n / math.tan(0.5 * a)
    if fx is None and fy is None:
        raise DataError(f"{json_path}: {where}: missing key 'fl_x' (or 'camera_angle_x'): no focal length")
    fx = fy if fx is None else fx
    fy = fx if fy is None else fy
    if not (fx > 0 and fy > 0):
        raise DataError(f"{json_path}: {where}: non-positive focal length ({fx}, {fy})")
    cx, cy = get("cx"), get("cy")
    cx = 0.5 * W if cx is None else cx
    cy = 0.5 * H if cy is None else cy
    k = {key: (get(key) or 0.0) for key in ("k1", "k2", "k3", "k4", "p1", "p2")}

    model = frame.get("camera_model", meta.get("camera_model"))
    if model is None:
        model = "OPENCV" if any(k[x] != 0.0 for x in ("k1", "k2", "k3", "p1", "p2")) else "PINHOLE"
    if not isinstance(model, str):
        raise DataError(f"{json_path}: {where}: 'camera_model' must be a string, got {model!r}")
    if model in _PINHOLE_NAMES:
        bad = [x for x, v in k.items() if v != 0.0]
        if bad:
            raise DataError(f"{json_path}: {where}: camera_model {model} with nonzero distortion {bad[0]}="
                            f"{k[bad[0]]}; use camera_model OPENCV")
        return LensCamera("PINHOLE", W, H, (fx, fy, cx, cy))
    if model == "OPENCV":
        if k["k4"] != 0.0:
            raise DataError(f"{json_path}: {where}: k4={k['k4']} (nerfstudio's r^8 term) is not supported "
                            "for camera_model OPENCV")
        if k["k3"] != 0.0:
            return LensCamera("FULL_OPENCV", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"],
                                                    k["k3"], 0.0, 0.0, 0.0))
        return LensCamera("OPENCV", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"]))
    if model == "OPENCV_FISHEYE":
        if k["p1"] != 0.0 or k["p2"] != 0.0:
            raise DataError(f"{json_path}: {where}: camera_model OPENCV_FISHEYE has no p1/p2")
        return LensCamera("OPENCV_FISHEYE", W, H, (fx, fy, cx, cy, k["k1"], k["k2"], k["k3"], k["k4"]))
    raise DataError(f"{json_path}: {where}: camera_model {model!r} is not supported "
                    "(supported: PINHOLE, SIMPLE_PINHOLE, OPENCV, OPENCV_FISHEYE)")


def _read_ply_points(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xyz [M, 3], rgb [M, 3] in [0, 1])`` of a point-cloud PLY (grey when it has no colours)."""
    from plyfile import PlyData

    try:
        v = PlyData.read(str(path))["vertex"]
        xyz = np.stack([np.asarray(v[c], np.float64) for c in ("x", "y", "z")], 1)
        names = v.data.dtype.names
        if all(c in names for c in ("red", "green", "blue")):
            rgb = np.stack([np.asarray(v[c], np.float64) for c in ("red", "green", "blue")], 1) / 255.0
        else:
            rgb = np.full_like(xyz, 0.5)
    except Exception as e:  # plyfile raises many types for bad files
        raise DataError(f"{path}: cannot read point cloud ({type(e).__name__}: {e})") from e
    check_points(str(path), xyz)
    return torch.from_numpy(xyz).float(), torch.from_numpy(np.clip(rgb, 0, 1)).float()


def _norm(p: str) -> str:
    return os.path.normpath(p).replace("\\", "/")


def _split(json_path: Path, meta: dict, paths: list[str], test_every: int) -> tuple[list[int], list[int]]:
    """Indices (into name-sorted ``paths``) of (train, test)."""
    lists = {k: meta.get(k) for k in ("train_filenames", "val_filenames", "test_filenames")}
    if lists["train_filenames"] is not None:
        test_list = lists["test_filenames"] if lists["test_filenames"] is not None else lists["val_filenames"]
        for key, lst in (("train_filenames", lists["train_filenames"]), ("test/val_filenames", test_list)):
            if lst is not None and (not isinstance(lst, list) or not all(isinstance(x, str) for x in lst)):
                raise DataError(f"{json_path}: '{key}' must be a list of file paths")
        index = {_norm(p): i for i, p in enumerate(paths)}

        def pick(lst, key):
            out = []
            for p in lst or []:
                if _norm(p) not in index:
                    raise DataError(f"{json_path}: {key} names {p!r}, which is no frame's file_path")
                out.append(index[_norm(p)])
            return out

        return pick(lists["train_filenames"], "train_filenames"), pick(test_list, "test_filenames")
    n = len(paths)
    if test_every and test_every > 0:
        return [i for i in range(n) if i % test_every], [i for i in range(n) if i % test_every == 0]
    return list(range(n)), []


def load_transforms(
    path: Path,
    downscale: int = 1,
    background=(1.0, 1.0, 1.0),
    test_every: int = 8,
    masks: str = "none",
    cache_dir=None,
    blank_pixels: float = 0.0,
) -> SceneData:
    """Load a folder with one ``transforms.json`` (see the module docstring).

    Raises:
        DataError: missing/invalid json, keys, images, masks or point cloud.
    """
    if masks not in MASK_MODES:
        raise ValueError(f"masks must be one of {MASK_MODES}, got {masks!r}")
    root = Path(path)
    json_path = root / "transforms.json"
    meta = _read_json(json_path)
    bg = parse_background(background)
    raw = meta["frames"]
    for i, fr in enumerate(raw):
        if not isinstance(fr, dict):
            raise DataError(f"{json_path}: frames[{i}] must be a json object")
        if not isinstance(fr.get("file_path"), str):
            raise DataError(f"{json_path}: frames[{i}]: missing key 'file_path'")
    order = sorted(range(len(raw)), key=lambda i: raw[i]["file_path"])
    frames: list[Frame] = []
    for i in order:
        fr, where = raw[i], f"frames[{i}]"
        c2w = _transform(json_path, where, fr)
        ipath = _resolve_image(json_path, where, fr["file_path"])
        W, H = image_size(ipath)
        cam = lens_camera_from_json(json_path, where, meta, fr, W, H)
        check_intrinsics(f"{json_path}: {where}", *cam.fxfycxcy())
        img, alpha, (fx, fy, cx, cy) = load_camera_image(ipath, cam, downscale, bg, cache_dir, blank_pixels)
        loss_mask = None
        if masks != "none" and "mask_path" in fr:
            mpath = json_path.parent / str(fr["mask_path"])
            if not mpath.is_file():
                raise DataError(f"{mpath}: mask file not found (named by {json_path}, {where})")
            mW, mH = image_size(mpath)
            if (mW, mH) != (W, H):
                raise DataError(f"{mpath}: mask is {mW}x{mH} but its image {ipath.name} is {W}x{H}")
            m_img, m_alpha, _ = load_camera_image(mpath, cam, downscale, torch.zeros(3), cache_dir,
                                                  blank_pixels, kind="mask")
            m = m_img.mean(dim=-1)  # [h, w]
            if m_alpha is not None:
                m = m * m_alpha
            if masks == "background":
                img = img * m[..., None] + bg.view(1, 1, 3) * (1.0 - m[..., None])
                alpha = m if alpha is None else alpha * m
            else:
                loss_mask = m.contiguous()
        frames.append(Frame(
            stem=ipath.stem, image_path=ipath, image=img.contiguous(), mask=alpha,
            viewmat=check_pose(f"{json_path}: {where}", opengl_c2w_to_viewmat(c2w)),
            K=scaled_K(fx, fy, cx, cy, downscale), width=img.shape[1], height=img.shape[0],
            loss_mask=loss_mask,
        ))
    if not frames:
        raise DataError(f"{json_path}: 'frames' is empty: zero usable cameras")
    train_idx, test_idx = _split(json_path, meta, [f["file_path"] for f in (raw[i] for i in order)], test_every)
    train = [frames[i] for i in train_idx]
    test = [frames[i] for i in test_idx]
    if not train:
        raise DataError(f"{json_path}: zero training frames ({len(frames)} frame(s), test_every={test_every})")
    points = colors = None
    if isinstance(meta.get("ply_file_path"), str):
        ply = json_path.parent / meta["ply_file_path"]
        if not ply.is_file():
            raise DataError(f"{ply}: point cloud not found (ply_file_path in {json_path})")
        points, colors = _read_ply_points(ply)
    return SceneData(train=train, test=test, points=points, point_colors=colors, layout="transforms")
