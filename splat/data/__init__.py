"""Data loaders: every on-disk layout -> one :class:`SceneData` of :class:`Frame`.

Usage::

    from splat.data import load_scene
    scene = load_scene("path/to/scene", downscale=2)   # layout auto-detected
    for f in scene.train:
        f.image    # [H, W, 3] float32 in [0, 1], RGBA composited over the background
        f.mask     # [H, W] alpha, or None for RGB images
        f.viewmat  # [4, 4] world -> camera, OpenCV (x right, y down, z forward)
        f.K        # [3, 3] pixels; pixel (i, j) has its centre at (j + 0.5, i + 0.5)
    scene.points, scene.point_colors   # [M, 3] each (COLMAP) or None (NeRF)
    scene.scene_radius()               # 3DGS "cameras_extent"

Layouts (see :mod:`splat.data.colmap` and :mod:`splat.data.nerf`):

* ``"colmap"``: ``images/`` + ``sparse/0/{cameras,images,points3D}.{bin,txt}``
  (or ``sparse/`` directly).  Test split: every ``test_every``-th image in
  name order.
* ``"nerf"``: ``transforms_train.json`` [+ ``transforms_test.json``].

``layout="auto"`` picks COLMAP when a COLMAP model folder exists, else NeRF
when ``transforms_train.json`` exists (a folder with both, like the shared dev
scene, loads as COLMAP, which has initial points; pass ``layout="nerf"`` for
the json's own train/test split).  Every data problem raises
:class:`DataError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .colmap import find_sparse_dir, load_colmap
from .nerf import load_nerf
from .types import DataError, Frame, SceneData

__all__ = ["load_scene", "detect_layout", "Frame", "SceneData", "DataError"]

LAYOUTS = ("auto", "colmap", "nerf")


def detect_layout(path: Union[str, Path]) -> str:
    """``"colmap"`` if ``path/sparse/0`` (or a model in ``path/sparse``) exists,
    else ``"nerf"`` if ``path/transforms_train.json`` exists, else DataError."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: scene folder not found")
    if find_sparse_dir(root) is not None:
        return "colmap"
    if (root / "transforms_train.json").is_file():
        return "nerf"
    raise DataError(
        f"{root}: unrecognised scene folder: expected a COLMAP model in sparse/0/ "
        "(with images/) or a NeRF-synthetic transforms_train.json"
    )


def load_scene(
    path: Union[str, Path],
    downscale: int = 1,
    background=(1.0, 1.0, 1.0),
    test_every: int = 8,
    layout: str = "auto",
) -> SceneData:
    """Load a scene folder into a :class:`SceneData`.

    Args:
        path: the scene folder.
        downscale: positive integer; images are area-averaged by this factor
            (a size that is not a multiple is cropped at the right/bottom) and
            ``K`` is divided by it, which is exact under the pixel-centre
            convention.
        background: RGB in [0, 1] that RGBA images are composited over.
        test_every: COLMAP only: every ``test_every``-th image (index 0
            included, name-sorted) is a test view; ``<= 0`` for none.  NeRF
            uses its own ``transforms_test.json`` instead.
        layout: ``"auto"``, ``"colmap"`` or ``"nerf"``.

    Raises:
        DataError: any problem with the data, naming the file.
        ValueError: bad arguments (layout, downscale, background).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if isinstance(downscale, bool) or int(downscale) != downscale or downscale < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale!r}")
    downscale = int(downscale)
    root = Path(path)
    if layout == "auto":
        layout = detect_layout(root)
    elif not root.is_dir():
        raise DataError(f"{root}: scene folder not found")
    if layout == "colmap":
        return load_colmap(root, downscale=downscale, background=background, test_every=test_every)
    return load_nerf(root, downscale=downscale, background=background)
