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

The photos are checked first (:func:`check_images`): a file that is empty,
not an image, truncated, or of an absurd size is skipped with one line on
stderr saying which and why, and too few usable photos is an error.

Nothing in OUT changes until every step has succeeded: the whole result is
built in a hidden folder ``OUT/.convert-new-*`` (marked as convert's by a
``.splat-convert`` file), and only then moved into place -- a previous
``images``/``sparse``/``distorted`` (replaced with ``overwrite`` only) is
renamed aside into ``OUT/.convert-old-*``, the new ones are moved in, and
the old ones deleted.  A failure or an interrupt (Ctrl+C, SIGTERM) removes
the work folder and leaves OUT as it was; a work folder left by a killed
run is recognised by its marker and removed by the next run.  Anything in
OUT that convert cannot tell it wrote -- e.g. the ``distorted/`` of the
3DGS ``convert.py`` layout (``input/``, ``distorted/database.db``,
``distorted/sparse/``) -- is never deleted without ``overwrite``.

Mistakes a user can make (missing folder, no usable images, an unknown
camera model, an output folder that holds something else, a reconstruction
that fails or registers too few images) raise :class:`SfmError`, a
:class:`~splat.errors.SplatInputError`, so ``convert.py`` prints them as one
line ``error: ...``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, List, Optional, Union

from ..errors import SplatInputError

__all__ = [
    "convert",
    "ConvertResult",
    "SfmError",
    "find_images",
    "check_images",
    "import_pycolmap",
    "CAMERA_MODELS",
    "IMAGE_EXTENSIONS",
    "MATCHERS",
]

#: File name endings read as images (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")
#: Camera models offered for the distorted reconstruction (COLMAP's names);
#: the undistorter turns each of them into PINHOLE.
CAMERA_MODELS = (
    "SIMPLE_PINHOLE",
    "PINHOLE",
    "SIMPLE_RADIAL",
    "RADIAL",
    "OPENCV",
    "FULL_OPENCV",
    "OPENCV_FISHEYE",
    "SIMPLE_RADIAL_FISHEYE",
    "RADIAL_FISHEYE",
)
MATCHERS = ("exhaustive", "sequential")
#: What :func:`convert` writes in OUT (``overwrite=True`` replaces only these).
OUTPUTS = ("images", "sparse", "distorted")
#: Name prefixes of convert's hidden work folders in OUT (new result; old one set aside).
WORK_PREFIXES = (".convert-new-", ".convert-old-")
#: The file that marks a work folder as convert's own, so that a later run
#: may delete it (what it cannot tell it wrote, it leaves alone).
MARKER = ".splat-convert"
INSTALL_HINT = 'pip install -e ".[sfm]"'


class SfmError(SplatInputError):
    """The photos could not be turned into a scene (bad folder, no images,
    reconstruction failed); the message says what and, where it can, why."""


def import_pycolmap() -> ModuleType:
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


#: File signatures of the formats in IMAGE_EXTENSIONS: a file that starts
#: with one but does not decode is a damaged image, not some other file.
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"II*\x00", b"MM\x00*", b"BM")


def _image_problem(path: Path) -> Optional[str]:
    """Why the photo at ``path`` cannot be used, or None if it decodes."""
    from PIL import Image

    if path.stat().st_size == 0:
        return "empty file"
    try:
        with warnings.catch_warnings():
            # Photos over PIL's warning size (89 MP) are fine; over twice that it raises.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
                # Decoding finds truncated and corrupt data; a JPEG decodes at
                # 1/8 scale (DCT scaling) for speed, still reading all its data.
                im.draft("RGB", (max(w // 8, 1), max(h // 8, 1)))
                im.load()
    except Image.DecompressionBombError as e:
        n = re.search(r"\((\d+) pixels\)", str(e))
        return (
            f"absurd size: {int(n.group(1)):,} pixels (at most {2 * Image.MAX_IMAGE_PIXELS:,})"
            if n
            else f"absurd size ({e})"
        )
    except Image.UnidentifiedImageError:
        with open(path, "rb") as f:
            head = f.read(8)
        if head.startswith(_SIGNATURES):
            return "truncated or corrupt image (its header does not parse)"
        return "not an image (no format PIL can read)"
    except (OSError, SyntaxError, ValueError) as e:  # what PIL raises for damaged data
        what = "truncated" if "truncated" in str(e) else "corrupt"
        return f"{what} image ({type(e).__name__}: {e})"
    return None


def check_images(folder: Union[str, Path], names: List[str], minimum: int, say: Callable[[str], None]) -> List[str]:
    """The ``names`` (from :func:`find_images`) whose files decode as images.

    Each one skipped -- empty, not an image, truncated or corrupt, or of an
    absurd size (over PIL's decompression-bomb limit, about 179 megapixels:
    COLMAP would try to allocate it) -- is named with the reason in one line
    through ``say``; fewer than ``minimum`` usable images is an SfmError."""
    folder = Path(folder)
    good = []
    for name in names:
        problem = _image_problem(folder / name)
        if problem is None:
            good.append(name)
        else:
            say(f"skipped {folder / name}: {problem}")
    if len(good) < minimum:
        skipped = f" ({len(names) - len(good)} skipped, see above)" if len(good) < len(names) else ""
        raise SfmError(
            f"{folder}: only {len(good)} usable image{'s' * (len(good) != 1)}{skipped}; at least {minimum} are needed"
        )
    return good


@dataclass
class ConvertResult:
    """What :func:`convert` did."""

    out: Path  # the scene folder (images/ + sparse/0/)
    num_images: int  # usable images found (see check_images)
    num_registered: int  # images with a recovered pose (in the kept model)
    num_points: int  # triangulated 3D points of the kept model
    num_models: int  # models the mapper built (1 when every image connects)
    unregistered: List[str] = field(default_factory=list)  # names left out of the scene
    skipped: List[str] = field(default_factory=list)  # files that are not usable images
    steps: List[str] = field(default_factory=list)  # steps that ran, with their times


def _check_out(images: Path, out: Path, overwrite: bool, say: Callable[[str], None]) -> None:
    """OUT may be new, empty, hold other things (e.g. the photos in
    ``input/``), or, with ``overwrite``, a previous result; removes the work
    folders of a killed run of convert (recognised by :data:`MARKER`)."""
    if out.exists() and not out.is_dir():
        raise SfmError(f"{out}: output folder is a file")
    img_res, out_res = images.resolve(), out.resolve()
    for name in OUTPUTS:
        if img_res == out_res / name or out_res / name in img_res.parents:
            raise SfmError(
                f"{images}: the input images lie inside the output {out / name}, which convert "
                f"writes; put the photos elsewhere (e.g. {out / 'input'}) or choose another --out"
            )
    if out_res == img_res or img_res in out_res.parents:
        where = "the images folder" if out_res == img_res else f"inside the images folder {images}"
        raise SfmError(
            f"{out}: the output folder is {where}; choose an --out outside it (photos in OUT/input/ are fine)"
        )
    if not out.is_dir():
        return
    present = [n for n in OUTPUTS if os.path.lexists(out / n)]
    if present and not overwrite:
        raise SfmError(
            f"{out}: already holds {', '.join(present)}: choose another --out, "
            f"or --overwrite to replace {'them' if len(present) > 1 else 'it'}"
        )
    for p in sorted(out.iterdir()):
        if not (p.name.startswith(WORK_PREFIXES) and p.is_dir() and not p.is_symlink() and (p / MARKER).is_file()):
            continue  # not convert's: left alone
        if p.name.startswith(WORK_PREFIXES[1]) and any(os.path.lexists(p / n) for n in OUTPUTS):
            # Only a kill (SIGKILL, power loss) in the instant between the renames leaves this.
            raise SfmError(
                f"{p}: holds the previous result, set aside by a conversion killed while "
                f"replacing it: move its {', '.join(OUTPUTS)} back into {out} (or delete it)"
            )
        shutil.rmtree(p)
        say(f"removed {p} (left by an interrupted conversion)")


def _work_folder(out: Path, prefix: str) -> Path:
    """A new hidden folder in OUT, marked as convert's (see :data:`MARKER`)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=out))
    except OSError as e:
        raise SfmError(f"{out}: cannot create the output folder ({e.strerror or e})") from None
    (work / MARKER).write_text("work folder of splat's convert.py: deleted when it ends\n")
    return work


def _move_into_place(new: Path, out: Path) -> None:
    """Replace OUT's :data:`OUTPUTS` by those in ``new``: the old ones are
    renamed aside, the new ones moved in, then the old ones deleted; if a
    rename fails, the old ones are put back before the error propagates."""
    aside = _work_folder(out, WORK_PREFIXES[1])
    old = [n for n in OUTPUTS if os.path.lexists(out / n)]
    moved_out, moved_in = [], []
    try:
        for n in old:
            (out / n).rename(aside / n)
            moved_out.append(n)
        for n in OUTPUTS:
            (new / n).rename(out / n)
            moved_in.append(n)
    except BaseException:
        for n in moved_in:
            (out / n).rename(new / n)
        for n in moved_out:
            (aside / n).rename(out / n)
        shutil.rmtree(aside)
        raise
    shutil.rmtree(aside)


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
        images: folder of photos (subfolders included; see :func:`find_images`);
            files that do not decode are skipped (see :func:`check_images`).
        out: the scene folder to write (``images/``, ``sparse/0/``, ``distorted/``).
        matcher: ``"exhaustive"`` (every pair; photos) or ``"sequential"``
            (each image with the next ``overlap`` in name order; video frames).
        camera_model: COLMAP camera model estimated by the mapper (one of
            :data:`CAMERA_MODELS`); the output is always PINHOLE.
        single_camera: one shared camera (intrinsics) for every image, as for
            photos from one phone at one zoom; otherwise one per image.
        min_registered: fewer usable or registered images than this is an error.
        num_threads: threads for every step (-1: all cores).
        seed: mapper's random seed (runs are repeatable for a given seed).
        overwrite: replace the ``images``, ``sparse`` and ``distorted`` already in
            ``out`` (once the new result is complete); without it they are an error.
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
    found = find_images(images)
    _check_out(images, out, overwrite, say)  # before the slow part: decoding every photo
    names = check_images(images, found, min_registered, say)
    pycolmap = import_pycolmap()
    existed = out.exists()
    new = _work_folder(out, WORK_PREFIXES[0])
    try:
        result = _reconstruct(
            pycolmap,
            images,
            names,
            new,
            matcher=matcher,
            camera_model=camera_model,
            single_camera=single_camera,
            overlap=overlap,
            min_registered=min_registered,
            num_threads=num_threads,
            seed=seed,
            verbose=verbose,
            say=say,
        )
        _move_into_place(new, out)
    except BaseException:  # failed or interrupted: OUT is left as it was
        shutil.rmtree(new, ignore_errors=True)
        if not existed:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty
        raise
    shutil.rmtree(new)  # the marker, and the undistorter's stereo/ and patch-match scripts
    result.out = out
    result.skipped = sorted(set(found) - set(names))
    skipped = f" ({len(result.skipped)} other files skipped, see above)" if result.skipped else ""
    for line in (
        f"registered {result.num_registered} of {len(names)} images{skipped}; scene written to {out}",
        f"train it with: splat train --data {out}",
    ):
        say(line)
    return result


def _reconstruct(
    pycolmap,
    images: Path,
    names: List[str],
    work: Path,
    *,
    matcher: str,
    camera_model: str,
    single_camera: bool,
    overlap: int,
    min_registered: int,
    num_threads: int,
    seed: int,
    verbose: bool,
    say: Callable[[str], None],
) -> ConvertResult:
    """The four steps of :func:`convert`, writing ``work/{distorted,images,sparse}``."""
    pycolmap.logging.minloglevel = 0 if verbose else 3  # our own messages say what failed
    distorted = work / "distorted"
    (distorted / "sparse").mkdir(parents=True)
    db = distorted / "database.db"
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
    step(
        f"feature extraction: {len(names)} images, {camera_model}{', one shared camera' if single_camera else ''}",
        lambda: pycolmap.extract_features(
            db, images, image_names=names, camera_mode=mode, reader_options=reader, extraction_options=extraction
        ),
    )

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
        step(
            f"sequential matching (overlap {overlap})",
            lambda: pycolmap.match_sequential(db, matching_options=matching, pairing_options=pairing),
        )

    # 3. mapping
    mapping = pycolmap.IncrementalPipelineOptions()
    mapping.num_threads = num_threads
    mapping.random_seed = int(seed)
    mapping.min_model_size = 2  # keep small models (COLMAP drops those under 10 images): min_registered decides
    models = step(
        "incremental mapping", lambda: pycolmap.incremental_mapping(db, images, distorted / "sparse", options=mapping)
    )
    if not models:
        raise SfmError(
            f"{images}: reconstruction failed: no model could be started from the {len(names)} images "
            f"(too few matched features between them: the photos need overlap and texture"
            f"{'; try --matcher exhaustive' if matcher == 'sequential' else ''})"
        )
    best_id, best = max(models.items(), key=lambda kv: (kv[1].num_reg_images(), -kv[0]))
    n_reg = int(best.num_reg_images())
    registered = {img.name for img in best.images.values() if img.has_pose}
    unregistered = [n for n in names if n not in registered]
    say(
        f"      registered {n_reg} of {len(names)} images, {best.num_points3D()} points"
        + (f" (model {best_id} of {len(models)})" if len(models) > 1 else "")
    )
    if n_reg < min_registered:
        raise SfmError(
            f"{images}: reconstruction failed: only {n_reg} of {len(names)} images were registered "
            f"(at least {min_registered} needed); the photos need more overlap and texture"
        )

    # 4. undistortion into a staging folder, then arranged as COLMAP's scene layout
    staging = work / "undistorted"
    undist = pycolmap.UndistortCameraOptions()
    undist.blank_pixels = 0.0  # only valid pixels (COLMAP's default crop)
    step(
        "undistortion to PINHOLE",
        lambda: pycolmap.undistort_images(
            staging,
            distorted / "sparse" / str(best_id),
            images,
            output_type="COLMAP",
            undistort_options=undist,
            num_threads=num_threads,
        ),
    )
    (staging / "sparse" / "0").mkdir()
    for p in list((staging / "sparse").iterdir()):
        if p.is_file():
            p.rename(staging / "sparse" / "0" / p.name)
    (staging / "images").rename(work / "images")
    (staging / "sparse").rename(work / "sparse")
    return ConvertResult(
        out=work,
        num_images=len(names),
        num_registered=n_reg,
        num_points=int(best.num_points3D()),
        num_models=len(models),
        unregistered=unregistered,
        steps=steps,
    )
