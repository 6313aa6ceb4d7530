"""Builders of tiny on-disk scenes for tests/test_data.py.

Everything is written from ground truth kept here (camera centres, look-at
rotations, intrinsics), independently of splat.data, so that the tests can
check the loaders against it: COLMAP text and binary writers, a NeRF-synthetic
json writer, and random PNG images.

Conventions of the ground truth: ``c2w_cv`` is camera -> world in the OpenCV
convention (columns: x right, y down, z forward, then the centre).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

COLMAP_MODEL_IDS = {
    "SIMPLE_PINHOLE": 0,
    "PINHOLE": 1,
    "SIMPLE_RADIAL": 2,
    "RADIAL": 3,
    "OPENCV": 4,
    "FOV": 7,
    "THIN_PRISM_FISHEYE": 10,
}


# ---------------------------------------------------------------- geometry


def look_at_c2w_cv(center, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Camera -> world ``[4, 4]`` (OpenCV axes) for a camera at ``center``
    looking at ``target`` with world ``up`` pointing towards smaller rows."""
    c = np.asarray(center, dtype=np.float64)
    z = np.asarray(target, dtype=np.float64) - c
    z /= np.linalg.norm(z)
    x = np.cross(z, np.asarray(up, dtype=np.float64))
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    M = np.eye(4)
    M[:3, 0], M[:3, 1], M[:3, 2], M[:3, 3] = x, y, z, c
    return M


def rotmat_to_qvec(R: np.ndarray) -> np.ndarray:
    """Rotation ``[3, 3]`` -> unit quaternion (w, x, y, z) with w >= 0
    (Shepperd's method)."""
    R = np.asarray(R, dtype=np.float64)
    tr = np.trace(R)
    if tr > 0:
        s = 2.0 * np.sqrt(tr + 1.0)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif R[0, 0] > R[1, 1] and R[0, 0] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[0, 0] - R[1, 1] - R[2, 2])
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif R[1, 1] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[1, 1] - R[0, 0] - R[2, 2])
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + R[2, 2] - R[0, 0] - R[1, 1])
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def project(points: np.ndarray, c2w_cv: np.ndarray, fx, fy, cx, cy) -> np.ndarray:
    """Ground-truth pinhole projection of world ``points [N, 3]`` -> ``[N, 3]``
    (u, v, z) with u, v in pixels (pixel-centre convention)."""
    R, C = c2w_cv[:3, :3], c2w_cv[:3, 3]
    Xc = (np.asarray(points, dtype=np.float64) - C) @ R  # = R^T (p - C), [N, 3]
    z = Xc[:, 2]
    return np.stack([fx * Xc[:, 0] / z + cx, fy * Xc[:, 1] / z + cy, z], axis=1)


# ---------------------------------------------------------------- scene


@dataclass
class Cam:
    id: int
    model: str
    width: int
    height: int
    params: list  # model parameters as COLMAP orders them

    def fxfycxcy(self):
        p = self.params
        if self.model == "SIMPLE_PINHOLE":
            return p[0], p[0], p[1], p[2]
        return p[0], p[1], p[2], p[3]


@dataclass
class View:
    id: int
    name: str  # file name under images/
    cam_id: int
    c2w_cv: np.ndarray  # [4, 4]
    pixels: np.ndarray  # [H, W, 3|4] uint8

    @property
    def viewmat(self) -> np.ndarray:  # [4, 4] world -> camera
        return np.linalg.inv(self.c2w_cv)


@dataclass
class Scene:
    cams: list
    views: list
    xyz: np.ndarray  # [M, 3]
    rgb: np.ndarray  # [M, 3] uint8
    cam_by_id: dict = field(default_factory=dict)

    def __post_init__(self):
        self.cam_by_id = {c.id: c for c in self.cams}


def make_scene(
    n_views: int = 9,
    width: int = 16,
    height: int = 12,
    model: str = "PINHOLE",
    params: Optional[list] = None,
    rgba: bool = False,
    n_points: int = 20,
    seed: int = 0,
) -> Scene:
    """A ring of ``n_views`` cameras at radius ~4 around the origin, all
    looking at it, one shared camera, random images and points.

    Image ids are deliberately not in name order and names are
    ``view_XX.png``.
    """
    rng = np.random.default_rng(seed)
    if params is None:
        params = [14.0, 15.0, 8.0, 6.0] if model == "PINHOLE" else [14.0, 8.0, 6.0]
    cam = Cam(1, model, width, height, list(params))
    views = []
    ids = rng.permutation(n_views) + 3
    for k in range(n_views):
        a = 2 * np.pi * k / n_views
        center = np.array([4 * np.cos(a), 4 * np.sin(a), 1.0 + 0.3 * np.sin(3 * a)])
        target = rng.normal(scale=0.1, size=3)
        c2w = look_at_c2w_cv(center, target)
        ch = 4 if rgba else 3
        pix = rng.integers(0, 256, size=(height, width, ch), dtype=np.uint8)
        views.append(View(int(ids[k]), f"view_{k:02d}.png", cam.id, c2w, pix))
    xyz = rng.normal(size=(n_points, 3))
    rgb = rng.integers(0, 256, size=(n_points, 3), dtype=np.uint8)
    return Scene([cam], views, xyz, rgb)


def write_images(folder: Path, views) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for v in views:
        mode = "RGBA" if v.pixels.shape[2] == 4 else "RGB"
        Image.fromarray(v.pixels, mode).save(folder / v.name)


def _points2d(view: View, scene: Scene):
    """A few (x, y, point3D_id) triples so that the files carry real tracks."""
    return [(1.5 + k, 2.5 + k, k + 1) for k in range(min(3, len(scene.xyz)))] + [(0.25, 0.75, -1)]


def write_colmap_text(sparse: Path, scene: Scene) -> None:
    sparse.mkdir(parents=True, exist_ok=True)
    with open(sparse / "cameras.txt", "w") as f:
        f.write("# Camera list with one line of data per camera:\n#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n")
        for c in scene.cams:
            f.write(f"{c.id} {c.model} {c.width} {c.height} " + " ".join(repr(float(p)) for p in c.params) + "\n")
    with open(sparse / "images.txt", "w") as f:
        f.write("# Image list with two lines of data per image:\n")
        f.write("#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n#   POINTS2D[] as (X, Y, POINT3D_ID)\n")
        for i, v in enumerate(scene.views):
            V = v.viewmat
            q, t = rotmat_to_qvec(V[:3, :3]), V[:3, 3]
            f.write(f"{v.id} " + " ".join(repr(float(x)) for x in (*q, *t)) + f" {v.cam_id} {v.name}\n")
            # alternate empty and non-empty POINTS2D lines
            pts = _points2d(v, scene) if i % 2 else []
            f.write(" ".join(f"{x} {y} {pid}" for x, y, pid in pts) + "\n")
    with open(sparse / "points3D.txt", "w") as f:
        f.write("# 3D point list with one line of data per point:\n")
        for k, (p, c) in enumerate(zip(scene.xyz, scene.rgb)):
            track = " ".join(f"{v.id} {j}" for j, v in enumerate(scene.views[:2]))
            xyz = f"{float(p[0])!r} {float(p[1])!r} {float(p[2])!r}"
            f.write(f"{k + 1} {xyz} {int(c[0])} {int(c[1])} {int(c[2])} 0.5 {track}\n")


def write_colmap_binary(sparse: Path, scene: Scene) -> None:
    sparse.mkdir(parents=True, exist_ok=True)
    with open(sparse / "cameras.bin", "wb") as f:
        f.write(struct.pack("<Q", len(scene.cams)))
        for c in scene.cams:
            f.write(struct.pack("<iiQQ", c.id, COLMAP_MODEL_IDS[c.model], c.width, c.height))
            f.write(struct.pack("<" + "d" * len(c.params), *c.params))
    with open(sparse / "images.bin", "wb") as f:
        f.write(struct.pack("<Q", len(scene.views)))
        for i, v in enumerate(scene.views):
            V = v.viewmat
            q, t = rotmat_to_qvec(V[:3, :3]), V[:3, 3]
            f.write(struct.pack("<i7di", v.id, *q, *t, v.cam_id))
            f.write(v.name.encode() + b"\x00")
            pts = _points2d(v, scene) if i % 2 else []
            f.write(struct.pack("<Q", len(pts)))
            for x, y, pid in pts:
                f.write(struct.pack("<ddq", x, y, pid))
    with open(sparse / "points3D.bin", "wb") as f:
        f.write(struct.pack("<Q", len(scene.xyz)))
        for k, (p, c) in enumerate(zip(scene.xyz, scene.rgb)):
            f.write(struct.pack("<Q3d3Bd", k + 1, *p, *(int(x) for x in c), 0.5))
            track = [(v.id, j) for j, v in enumerate(scene.views[:2])]
            f.write(struct.pack("<Q", len(track)))
            for iid, j in track:
                f.write(struct.pack("<ii", iid, j))


def write_colmap_scene(root: Path, scene: Scene, fmt: str = "text", sparse_subdir: str = "sparse/0") -> Path:
    """images/ + sparse model in ``fmt`` ("text" or "binary"); returns root."""
    root = Path(root)
    write_images(root / "images", scene.views)
    sparse = root / sparse_subdir
    (write_colmap_text if fmt == "text" else write_colmap_binary)(sparse, scene)
    return root


def c2w_cv_to_gl(c2w_cv: np.ndarray) -> np.ndarray:
    """OpenCV camera -> world to the OpenGL/NeRF convention (negate y, z axes)."""
    return c2w_cv @ np.diag([1.0, -1.0, -1.0, 1.0])


def write_nerf_json(path: Path, frames: list, **top) -> None:
    """``frames``: list of ``(file_path, c2w_gl [4, 4])`` or dicts written as-is."""
    out = dict(top)
    out["frames"] = [
        fr if isinstance(fr, dict) else {"file_path": fr[0], "transform_matrix": np.asarray(fr[1]).tolist()}
        for fr in frames
    ]
    Path(path).write_text(json.dumps(out, indent=1))


def write_nerf_scene(
    root: Path,
    scene: Scene,
    n_test: int = 2,
    with_ext: bool = True,
    angle_x: Optional[float] = None,
    **top,
) -> Path:
    """Images under ``root/images``; the last ``n_test`` views go to
    transforms_test.json.  ``angle_x=None`` derives camera_angle_x from the
    scene camera's fx (its cx, cy must be the image centre)."""
    root = Path(root)
    write_images(root / "images", scene.views)
    cam = scene.cams[0]
    if angle_x is None and "fl_x" not in top:
        angle_x = 2 * np.arctan(0.5 * cam.width / cam.fxfycxcy()[0])
    if angle_x is not None:
        top["camera_angle_x"] = float(angle_x)

    def fp(v):
        name = f"images/{v.name}"
        return name if with_ext else name[: -len(".png")]

    split = len(scene.views) - n_test
    write_nerf_json(
        root / "transforms_train.json", [(fp(v), c2w_cv_to_gl(v.c2w_cv)) for v in scene.views[:split]], **top
    )
    if n_test:
        write_nerf_json(
            root / "transforms_test.json", [(fp(v), c2w_cv_to_gl(v.c2w_cv)) for v in scene.views[split:]], **top
        )
    return root


def truncate_file(path: Path, drop: int = 5) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) - drop])


def write_png(path: Path, pixels: np.ndarray, size=None) -> None:
    """A PNG written by hand from the spec (so tests can make any bit depth and
    colour type, independently of the readers under test).

    ``pixels``: uint8 or uint16 [H, W] (grey), [H, W, 2] (grey + alpha),
    [H, W, 3] (RGB) or [H, W, 4] (RGBA).  ``size=(W, H)`` overrides the size
    in the header (for decompression-bomb headers; the pixel data is then
    whatever ``pixels`` holds).
    """
    import zlib

    a = np.asarray(pixels)
    if a.ndim == 2:
        a = a[..., None]
    H, W, C = a.shape
    depth = 16 if a.dtype == np.uint16 else 8
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[C]
    raw = a.astype(">u2" if depth == 16 else np.uint8).reshape(H, -1).view(np.uint8)
    data = b"".join(b"\x00" + row.tobytes() for row in raw)  # filter type 0 per row
    W, H = size if size is not None else (W, H)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", W, H, depth, color_type, 0, 0, 0)
    Path(path).write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")
    )
