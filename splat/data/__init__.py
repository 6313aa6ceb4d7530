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
* ``"transforms"``: one nerfstudio / instant-ngp ``transforms.json`` (see
  :mod:`splat.data.transforms`): lens distortion, masks, optional split.
* ``"nerf"``: ``transforms_train.json`` [+ ``transforms_test.json``].

Distorted cameras (COLMAP SIMPLE_RADIAL, RADIAL, OPENCV, FULL_OPENCV,
OPENCV_FISHEYE; distorted ``transforms.json`` cameras) are undistorted at load
into pinhole cameras, cached on disk (:mod:`splat.data.undistort`).

``layout="auto"`` picks COLMAP when a COLMAP model folder exists, else
``transforms`` when ``transforms.json`` exists, else NeRF when
``transforms_train.json`` exists (a folder with several, like the shared dev
scenes, loads as COLMAP, which has initial points; pass ``layout=...`` to
choose).  Every data problem raises :class:`DataError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .background import WHITE
from .colmap import find_sparse_dir, load_colmap
from .nerf import load_nerf
from .transforms import MASK_MODES, load_transforms
from .types import BackgroundLike, DataError, Frame, SceneData

__all__ = ["load_scene", "load_scene_from_config", "detect_layout", "Frame", "SceneData", "DataError"]

LAYOUTS = ("auto", "colmap", "transforms", "nerf")


def detect_layout(path: Union[str, Path]) -> str:
    """``"colmap"`` if ``path/sparse/0`` (or a model in ``path/sparse``) exists,
    else ``"transforms"`` if ``path/transforms.json`` exists, else ``"nerf"``
    if ``path/transforms_train.json`` exists, else DataError."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: scene folder not found")
    if find_sparse_dir(root) is not None:
        return "colmap"
    if (root / "transforms.json").is_file():
        return "transforms"
    if (root / "transforms_train.json").is_file():
        return "nerf"
    raise DataError(
        f"{root}: unrecognised scene folder: expected a COLMAP model in sparse/0/ "
        "(with images/), a transforms.json (nerfstudio / instant-ngp) or a NeRF-synthetic "
        "transforms_train.json"
    )


def load_scene(
    path: Union[str, Path],
    downscale: int = 1,
    background: BackgroundLike = (1.0, 1.0, 1.0),
    test_every: int = 8,
    layout: str = "auto",
    masks: str = "none",
    cache_dir: Optional[Union[str, Path]] = None,
    blank_pixels: float = 0.0,
    eval_masks: bool = False,
) -> SceneData:
    """Load a scene folder into a :class:`SceneData`.

    Args:
        path: the scene folder.
        downscale: positive integer; images are area-averaged by this factor
            (a size that is not a multiple is cropped at the right/bottom) and
            ``K`` is divided by it, which is exact under the pixel-centre
            convention.
        background: RGB in [0, 1] that RGBA images are composited over.
        test_every: COLMAP and ``transforms.json`` without a split: every
            ``test_every``-th image (index 0 included, name-sorted) is a test
            view; ``<= 0`` for none.  NeRF uses its own
            ``transforms_test.json`` instead.
        layout: ``"auto"``, ``"colmap"``, ``"transforms"`` or ``"nerf"``.
        masks: ``transforms.json`` ``mask_path`` masks: ``"none"``,
            ``"background"`` (masked-out pixels become the background) or
            ``"ignore"`` (left out of the loss via ``Frame.loss_mask``).
        cache_dir: folder of the undistorted-image cache (None: the default,
            see :func:`splat.data.undistort.default_cache_dir`).
        blank_pixels: undistortion crop, 0 = only valid pixels (COLMAP's
            default), 1 = every source pixel with a blank border.
        eval_masks: ``transforms.json``: read the test frames' ``mask_path``
            into ``Frame.object_mask`` even with ``masks="none"`` (for the
            masked test metrics, ``eval.masked``); other layouts have no
            mask files.

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
    if masks not in MASK_MODES:
        raise ValueError(f"masks must be one of {MASK_MODES}, got {masks!r}")
    und = dict(cache_dir=cache_dir, blank_pixels=blank_pixels)
    if layout == "colmap":
        return load_colmap(root, downscale=downscale, background=background, test_every=test_every, **und)
    if layout == "transforms":
        return load_transforms(
            root,
            downscale=downscale,
            background=background,
            test_every=test_every,
            masks=masks,
            eval_masks=eval_masks,
            **und,
        )
    return load_nerf(root, downscale=downscale, background=background)


def load_scene_from_config(data_cfg: dict, eval_masks: bool = False) -> SceneData:
    """:func:`load_scene` with the arguments of a config's ``data`` section
    (see :class:`splat.config.DataConfig`); ``eval_masks`` as there (the
    trainer passes ``eval.masked != false``)."""
    d = data_cfg
    return load_scene(
        d["path"],
        downscale=d["downscale"],
        background=WHITE if d["background"] == "auto" else d["background"],  # auto: RGBA over white
        test_every=d["test_every"],
        layout=d["layout"],
        masks=d["masks"],
        cache_dir=d["cache_dir"] or None,
        blank_pixels=d["undistort_blank_pixels"],
        eval_masks=eval_masks,
    )
