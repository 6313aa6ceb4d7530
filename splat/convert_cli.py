"""Unposed photos -> a scene folder that ``splat train`` reads (COLMAP layout);
``splat convert``, or ``python convert.py`` in a checkout.

    splat convert --images photos/ --out scenes/garden
    splat convert --images frames/ --out scenes/walk --matcher sequential --single-camera
    splat train --data scenes/garden --out output/garden

Runs pycolmap (``pip install -e ".[sfm]"``): SIFT features, exhaustive or
sequential matching, incremental mapping, undistortion to PINHOLE; writes
OUT/images/ + OUT/sparse/0/ (and OUT/distorted/: the database and the
distorted model).  Files that are empty, not images, truncated or of an
absurd size are skipped, each named on one line.  OUT changes only when
every step has succeeded: the result is built in a hidden folder in OUT and
then moved into place, so a failed or interrupted run leaves OUT as it was.
images/, sparse/ and distorted/ already in OUT (a previous conversion, or
the 3DGS convert.py's distorted/database.db) are replaced only with
--overwrite.  Mistakes print one line ``error: ...`` (exit code 1; 2 for bad
flags); Ctrl+C and SIGTERM stop it with one line too (exit codes 130 and
143); ``--debug`` shows the traceback instead.  The work is done by
splat.sfm.colmap_pipeline.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The flags of ``splat convert`` / ``convert.py`` (``prog``: the name in the usage line)."""
    from .sfm.colmap_pipeline import CAMERA_MODELS, MATCHERS  # (no pycolmap import)

    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", required=True, help="folder of photos or video frames (subfolders included)")
    p.add_argument("--out", required=True, help="scene folder to write (images/ + sparse/0/)")
    p.add_argument(
        "--matcher",
        choices=MATCHERS,
        default="exhaustive",
        help="exhaustive: every pair (photos); sequential: each frame with the next --overlap "
        "frames in name order (video)",
    )
    p.add_argument("--overlap", type=int, default=10, help="sequential matcher: frames matched ahead (default 10)")
    p.add_argument(
        "--camera-model",
        choices=CAMERA_MODELS,
        default="SIMPLE_RADIAL",
        help="lens model estimated by the mapper (default SIMPLE_RADIAL); the output is PINHOLE",
    )
    p.add_argument(
        "--single-camera", action="store_true", help="one shared camera for all images (one phone, one zoom setting)"
    )
    p.add_argument("--threads", type=int, default=-1, help="threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="mapper random seed")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the images/, sparse/ and distorted/ already in --out (once the new conversion has succeeded)",
    )
    p.add_argument("--verbose", action="store_true", help="show COLMAP's log")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    return p


def run(args: argparse.Namespace) -> int:
    """Convert as the parsed flags say (errors propagate; :func:`main` prints them)."""
    from .sfm import convert

    convert(
        args.images,
        args.out,
        matcher=args.matcher,
        camera_model=args.camera_model,
        single_camera=args.single_camera,
        overlap=args.overlap,
        num_threads=args.threads,
        seed=args.seed,
        overwrite=args.overwrite,
        verbose=args.verbose,
    )
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """CLI entry (module doc): the exit code."""
    args = build_parser(prog).parse_args(argv)
    from .errors import run_cli
    from .sfm.sigterm import sigterm_as_interrupt

    return run_cli(sigterm_as_interrupt(lambda: run(args), args.debug), debug=args.debug)
