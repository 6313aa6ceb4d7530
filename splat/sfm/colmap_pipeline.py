"""Unposed photos -> a COLMAP scene folder, with pycolmap.

:func:`convert` runs COLMAP's sparse pipeline through pycolmap (the
``sfm`` extra: ``pip install -e ".[sfm]"``)::

    1. feature extraction   pycolmap.extract_features (SIFT) -> OUT/distorted/database.db
    2. matching             pycolmap.match_exhaustive (every pair), or
                            pycolmap.match_sequential (each image with its next
                            ``overlap`` images in name order: video frames)
    3. incremental mapping  pycolmap.incremental_mapping -> OUT/distorted/sparse/<k>/
                            (the model that registers the most images is kept)
    4. undistortion         pycolmap.undistort_images -> PINHOLE cameras,
                            OUT/images/ + OUT/sparse/0/ (binary COLMAP model)

The result is the COLMAP layout :func:`splat.data.load_scene` reads
(``train.py --data OUT``), with the triangulated points as the initial
surfels.  ``OUT/distorted/`` keeps the database and the distorted model
(as the 3DGS ``convert.py`` does) for inspection or a re-run with COLMAP.

The final ``OUT/images`` and ``OUT/sparse/0`` appear only when every step
succeeded: the undistorter writes into a staging folder that is moved into
place at the end.

Mistakes a user can make (missing folder, no images, an unknown camera
model, an output folder that holds something else, a reconstruction that
fails or registers too few images) raise :class:`SfmError`, a
:class:`~splat.errors.SplatInputError`, so ``convert.py`` prints them as one
line ``error: ...``.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Union

from ..errors import SplatInputError

__all__ = ["convert", "ConvertResult", "SfmError", "find_images", "import_pycolmap", "CAMERA_MODELS",
           "IMAGE_EXTENSIONS", "MATCHERS"]

#: File name endings read as images (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")
#: Camera models offered for the distorted reconstruction (COLMAP's names);
#: the undistorter turns each of them into PINHOLE.
CAMERA_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV",
                 "OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")
MATCHERS = ("exhaustive", "sequential")
#: What :func:`convert` writes in OUT (``overwrite=True`` removes only these;
#: ``distorted`` and ``.staging`` alone, left by a failed run, are replaced
#: without it).
OUTPUTS = ("images", "sparse", "distorted", ".staging")
INSTALL_HINT = 'pip install -e ".[sfm]"'


class SfmError(SplatInputError):
    """The photos could not be turned into a scene (bad folder, no images,
    reconstruction failed); the message says what and, where it can, why."""


def import_pycolmap():
    """The pycolmap module, or SfmError naming the install command."""
    try:
        import pycolmap
    except ImportError:
        raise SfmError(f"pycolmap is not installed: {INSTALL_HINT}") from None
    return pycolmap


def find_images(folder: Union[str, Path]) -> List[str]:
    """Names (relative to ``folder``, '/'-separated, sorted) of the image
    files under ``folder`` and its subfolders; hidden files are skipped."""
    folder = Path(folder)
    if not folder.exists():
        raise SfmError(f"{folder}: images folder not found")
    if not folder.is_dir():
        raise SfmError(f"{folder}: is a file, not a folder of images")
    names = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if p.suffix.lower() in IMAGE_EXTENSIONS:
            names.append(rel.as_posix())
    if not names:
        raise SfmError(f"{folder}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)})")
    return sorted(names)


@dataclass
class ConvertResult:
    """What :func:`convert` did."""

    out: Path                      # the scene folder (images/ + sparse/0/)
    num_images: int                # images found
    num_registered: int            # images with a recovered pose (in the kept model)
    num_points: int                # triangulated 3D points of the kept model
    num_models: int                # models the mapper built (1 when every image connects)
    unregistered: List[str] = field(default_factory=list)  # names left out of the scene
    steps: List[str] = field(default_factory=list)         # steps that ran, with their times


def _prepare_out(images: Path, out: Path, overwrite: bool) -> None:
    """OUT may be new, empty, or (``overwrite``) hold a previous conversion."""
    if out.exists() and not out.is_dir():
        raise SfmError(f"{out}: output folder is a file")
    img_res, out_res = images.resolve(), out.resolve()
    for name in OUTPUTS:
        if img_res == out_res / name or out_res / name in img_res.parents:
            raise SfmError(f"{images}: the input images lie inside the output {out / name}, which convert "
                           f"writes; put the photos elsewhere (e.g. {out / 'input'}) or choose another --out")
    if out_res == img_res or img_res in out_res.parents:
        where = "the images folder" if out_res == img_res else f"inside the images folder {images}"
        raise SfmError(f"{out}: the output folder is {where}; choose an --out outside it "
                       f"(photos in OUT/input/ are fine)")
    if out.is_dir():
        present = [n for n in OUTPUTS if (out / n).exists()]
        done = [n for n in ("images", "sparse") if n in present]  # the rest: leftovers of a failed run
        if done and not overwrite:
            raise SfmError(f"{out}: already holds {', '.join(done)}: choose another --out, "
                           f"or --overwrite to replace them")
        for n in present:
            p = out / n
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SfmError(f"{out}: cannot create the output folder ({e.strerror or e})") from None


def convert(
    images: Union[str, Path],
    out: Union[str, Path],
    matcher: str = "exhaustive",
    camera_model: str = "SIMPLE_RADIAL",
    single_camera: bool = False,
    overlap: int = 10,
    min_registered: int = 3,
    num_threads: int = -1,
    seed: int = 0,
    overwrite: bool = False,
    verbose: bool = False,
    log: Optional[Callable[[str], None]] = None,
) -> ConvertResult:
    """Reconstruct the photos in ``images`` and write the scene folder ``out``.

    Args:
        images: folder of photos (subfolders included; see :func:`find_images`).
        out: the scene folder to write (``images/``, ``sparse/0/``, ``distorted/``).
        matcher: ``"exhaustive"`` (every pair; photos) or ``"sequential"``
            (each image with the next ``overlap`` in name order; video frames).
        camera_model: COLMAP camera model estimated by the mapper (one of
            :data:`CAMERA_MODELS`); the output is always PINHOLE.
        single_camera: one shared camera (intrinsics) for every image, as for
            photos from one phone at one zoom; otherwise one per image.
        min_registered: fewer registered images than this is an error.
        num_threads: threads for every step (-1: all cores).
        seed: mapper's random seed (runs are repeatable for a given seed).
        overwrite: replace a previous conversion in ``out``.
        verbose: show COLMAP's own log.
        log: called with one line per step (default: print to stderr).

    Raises:
        SfmError: any problem the user can fix (see the module doc).
    """
    say = log if log is not None else (lambda s: print(s, file=sys.stderr, flush=True))
    images, out = Path(images), Path(out)
    if matcher not in MATCHERS:
        raise SfmError(f"matcher must be one of {', '.join(MATCHERS)}, got {matcher!r}")
    if camera_model not in CAMERA_MODELS:
        raise SfmError(f"camera model must be one of {', '.join(CAMERA_MODELS)}, got {camera_model!r}")
    if matcher == "sequential" and int(overlap) < 1:  # COLMAP aborts the process on it
        raise SfmError(f"overlap must be at least 1 (frames matched ahead), got {overlap}")
    names = find_images(images)
    pycolmap = import_pycolmap()
    _prepare_out(images, out, overwrite)
    pycolmap.logging.minloglevel = 0 if verbose else 3  # our own messages say what failed
    work = out / "distorted"
    (work / "sparse").mkdir(parents=True, exist_ok=True)
    db = work / "database.db"
    steps: List[str] = []

    def step(title: str, fn):
        k = len(steps) + 1
        say(f"[{k}/4] {title} ...")
        t = time.perf_counter()
        value = fn()
        dt = time.perf_counter() - t
        steps.append(f"{title} ({dt:.1f} s)")
        return value

    # 1. features
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = camera_model
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = num_threads
    mode = pycolmap.CameraMode.SINGLE if single_camera else pycolmap.CameraMode.AUTO
    step(f"feature extraction: {len(names)} images, {camera_model}"
         f"{', one shared camera' if single_camera else ''}",
         lambda: pycolmap.extract_features(db, images, image_names=names, camera_mode=mode,
                                           reader_options=reader, extraction_options=extraction))

    # 2. matching
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = num_threads
    if matcher == "exhaustive":
        step("exhaustive matching", lambda: pycolmap.match_exhaustive(db, matching_options=matching))
    else:
        pairing = pycolmap.SequentialPairingOptions()
        pairing.overlap = int(overlap)
        pairing.loop_detection = False  # needs a vocabulary tree file
        pairing.num_threads = num_threads
        step(f"sequential matching (overlap {overlap})",
             lambda: pycolmap.match_sequential(db, matching_options=matching, pairing_options=pairing))

    # 3. mapping
    mapping = pycolmap.IncrementalPipelineOptions()
    mapping.num_threads = num_threads
    mapping.random_seed = int(seed)
    mapping.min_model_size = 2  # keep small models (COLMAP drops those under 10 images): min_registered decides
    models = step("incremental mapping",
                  lambda: pycolmap.incremental_mapping(db, images, work / "sparse", options=mapping))
    if not models:
        raise SfmError(
            f"{images}: reconstruction failed: no model could be started from the {len(names)} images "
            f"(too few matched features between them: the photos need overlap and texture"
            f"{'; try --matcher exhaustive' if matcher == 'sequential' else ''})")
    best_id, best = max(models.items(), key=lambda kv: (kv[1].num_reg_images(), -kv[0]))
    n_reg = int(best.num_reg_images())
    registered = {img.name for img in best.images.values() if img.has_pose}
    unregistered = [n for n in names if n not in registered]
    say(f"      registered {n_reg} of {len(names)} images, {best.num_points3D()} points"
        + (f" (model {best_id} of {len(models)})" if len(models) > 1 else ""))
    if n_reg < min_registered:
        raise SfmError(
            f"{images}: reconstruction failed: only {n_reg} of {len(names)} images were registered "
            f"(at least {min_registered} needed); the photos need more overlap and texture")

    # 4. undistortion into a staging folder, then moved into place
    staging = out / ".staging"
    undist = pycolmap.UndistortCameraOptions()
    undist.blank_pixels = 0.0  # only valid pixels (COLMAP's default crop)
    step("undistortion to PINHOLE",
         lambda: pycolmap.undistort_images(staging, work / "sparse" / str(best_id), images,
                                           output_type="COLMAP", undistort_options=undist,
                                           num_threads=num_threads))
    (staging / "sparse" / "0").mkdir()
    for p in list((staging / "sparse").iterdir()):
        if p.is_file():
            p.rename(staging / "sparse" / "0" / p.name)
    (staging / "images").rename(out / "images")
    (staging / "sparse").rename(out / "sparse")
    shutil.rmtree(staging)  # stereo/ and the patch-match scripts: not needed here
    for line in (f"registered {n_reg} of {len(names)} images; scene written to {out}",
                 f"train it with: python train.py --data {out}"):
        say(line)
    return ConvertResult(out=out, num_images=len(names), num_registered=n_reg,
                         num_points=int(best.num_points3D()), num_models=len(models),
                         unregistered=unregistered, steps=steps)
