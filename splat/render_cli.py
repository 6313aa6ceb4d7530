"""``splat render`` / ``render.py``'s command line: views (:mod:`splat.render_files`) and meshes (:mod:`splat.mesh`).

Mistakes print one line ``error: ...`` (exit 1; 2 for bad flags or an
open3d that is missing or cannot load), ``--debug`` shows tracebacks instead.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The flags of ``splat render`` / ``render.py`` (``prog``: the name in the usage line)."""
    from .mesh.extract import MeshOptions

    d = MeshOptions()
    p = argparse.ArgumentParser(
        prog=prog,
        description="Render a trained splat model (images, depth, normals) or extract its mesh.",
    )
    p.add_argument("--model", required=True, help="training output folder (holds config.yaml)")
    p.add_argument("--data", default=None, help="scene folder (default: the one in OUT/config.yaml)")
    p.add_argument(
        "--split",
        choices=("test", "train"),
        default=None,
        help="views to render (default: test, unless only a mesh is asked)",
    )
    m = p.add_argument_group("meshing (needs open3d: pip install open3d-cpu)")
    m.add_argument("--mesh", action="store_true", help="TSDF-fuse train-view depth into OUT/mesh.ply")
    m.add_argument(
        "--unbounded",
        action="store_true",
        help="mesh the whole scene, background included, into OUT/mesh_unbounded.ply",
    )
    m.add_argument(
        "--mesh-res",
        type=int,
        default=None,
        help=f"voxels across depth_trunc (default {d.mesh_res}); with --unbounded, "
        "samples per edge of the contracted grid (default 512)",
    )
    m.add_argument(
        "--depth-ratio",
        type=float,
        default=None,
        help="fused depth: 0 expected, 1 median, between: a mix (default: the run's render.depth)",
    )
    m.add_argument(
        "--depth-trunc", type=float, default=None, help="bounded: ignore depth beyond this (default 2 x scene radius)"
    )
    m.add_argument(
        "--alpha-min",
        type=float,
        default=d.alpha_min,
        help=f"fuse only pixels with at least this alpha (default {d.alpha_min})",
    )
    m.add_argument(
        "--keep-clusters",
        type=int,
        default=d.max_clusters,
        help=f"keep the N largest connected clusters, 0 = all (default {d.max_clusters})",
    )
    m.add_argument(
        "--keep-unseen",
        action="store_true",
        help="keep surfaces that lie behind what every view sees (removed by default)",
    )
    bar = p.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default="auto",
        help="force the progress bar (default: only when stderr is a terminal)",
    )
    bar.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, help="never draw the progress bar"
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. render.depth=expected")
    return p


def mesh_options(args, unbounded: bool):
    """:class:`splat.mesh.MeshOptions` from the parsed flags (bad values: ValueError naming the flag)."""
    from .mesh.extract import MeshOptions, check_options

    res = args.mesh_res if args.mesh_res is not None else (512 if unbounded else MeshOptions.mesh_res)
    if args.depth_ratio is not None and not 0.0 <= args.depth_ratio <= 1.0:
        raise ValueError(f"--depth-ratio: {args.depth_ratio} is not in [0, 1]")
    if args.keep_clusters < 0:
        raise ValueError(f"--keep-clusters: {args.keep_clusters} is negative")
    options = MeshOptions(
        mesh_res=res,
        depth_ratio=args.depth_ratio,
        alpha_min=args.alpha_min,
        depth_trunc=args.depth_trunc,
        keep_unseen=args.keep_unseen,
        max_clusters=args.keep_clusters,
    )
    check_options(options)
    return options


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """CLI entry (module doc): the exit code."""
    p = build_parser(prog)
    args = p.parse_intermixed_args(argv)  # key=value may stand between flags
    meshing = args.mesh or args.unbounded
    if meshing:
        from .mesh.open3d_import import MissingOpen3D, import_open3d

        try:
            options = {u: mesh_options(args, u) for u in (False, True)}
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        try:
            import_open3d("splat render --mesh")
        except MissingOpen3D as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from .data import DataError
    from .errors import run_cli
    from .render_files import render_split

    def run() -> int:
        if args.split is not None or not meshing:
            render_split(args.model, args.data, args.split or "test", args.overrides, args.progress)
        if args.mesh:
            from .mesh.extract import extract_mesh

            extract_mesh(
                args.model, args.data, args.overrides, unbounded=False, options=options[False], progress=args.progress
            )
        if args.unbounded:
            from .mesh.extract import extract_mesh

            extract_mesh(
                args.model, args.data, args.overrides, unbounded=True, options=options[True], progress=args.progress
            )
        return 0

    from .sfm.sigterm import sigterm_as_interrupt

    # SIGTERM (a scheduler, kill) ends a render or a mesh like Ctrl+C: one line, no partial file.
    return run_cli(sigterm_as_interrupt(run, args.debug), debug=args.debug, extra=(DataError,))
