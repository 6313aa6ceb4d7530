"""Fly around a trained splat model in the browser (``splat view``, or ``python view.py`` in a checkout).

    splat view --model output/sample_scene            # a training output folder
    splat view --model output/sample_scene/point_cloud.ply --port 8090

Serves a viser page on localhost (``pip install -e ".[viewer]"``) and prints
its address; if the port is taken, a free one is used and printed.  The page
shows the model rendered by ``splat.rasterize`` (RGB, expected/median depth,
normals, alpha, distortion), starting from the data set's first test camera.
A training output folder shows its ``point_cloud.ply``, or while it trains
its newest checkpoint.  Mistakes print one line ``error: ...`` (exit code 1);
``--debug`` shows the traceback instead.  Ctrl+C (or SIGTERM) stops the
server within about a second (exit code 0), even with browsers connected;
Ctrl+C while it starts up stops it with ``error: interrupted`` (exit code 130).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from .train_cli import CHECKOUT


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The flags of ``splat view`` / ``view.py`` (``prog``: the name in the usage line)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="training output folder, or a .ply file")
    p.add_argument("--data", default=None, help="scene folder for the start camera (default: the run's config)")
    p.add_argument("--port", type=int, default=8080, help="port to serve on (default 8080; a free one if taken)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "cpu", "cuda", "torch"),
        help="splat.rasterize backend (default auto)",
    )
    p.add_argument("--device", default="auto", help="torch device of the model (default: cuda if available, else cpu)")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    return p


def run(args: argparse.Namespace) -> int:
    """Serve the viewer until Ctrl+C (errors propagate; :func:`main` prints them)."""
    from .trainer import resolve_device
    from .viewer import require_viser
    from .viewer.load import load_for_viewer

    require_viser()  # before loading anything
    from .viewer.network import check_port

    check_port(args.port)
    device = resolve_device(args.device)
    inp = load_for_viewer(args.model, data=args.data, root=CHECKOUT)
    inp.model.to(device)
    from .viewer.server import ViewerServer

    view = ViewerServer(
        inp.model,
        inp.start,
        backend=args.backend,
        near=inp.near,
        far=inp.far,
        background=inp.background,
        host=args.host,
        port=args.port,
        scene_radius=inp.scene_radius,
        title=f"splat: {Path(args.model).name}",
    )
    print(f"viewer: {inp.model.num_gaussians} surfels from {inp.source} at {view.url}  (Ctrl+C to stop)", flush=True)
    try:
        view.serve_until_interrupted()
    finally:
        view.close()
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """CLI entry (module doc): the exit code."""
    args = build_parser(prog).parse_args(argv)
    from .data import DataError
    from .errors import run_cli

    return run_cli(lambda: run(args), debug=args.debug, extra=(DataError,))
