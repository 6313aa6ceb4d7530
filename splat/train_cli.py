"""Train a 2D-Gaussian-surfel model (``splat train``, or ``python train.py`` in a checkout).

    splat train                                       # data/sample_scene -> output/sample_scene, default config
    splat train --data DIR --out OUT --config fast --iterations 3000 loss.dist_lambda=0
    splat train --out OUT --resume                    # continue OUT from its newest checkpoint
    splat train --out OUT --resume train.iterations=8000   # ... and train longer

``--config`` takes a YAML file or the name of a config shipped with splat
(``default``, ``fast``: the files in splat/configs/, linked from configs/ in
a checkout).  ``key=value`` arguments override any config field (dotted keys
for nested sections, values parsed as YAML; they may stand anywhere among
the flags); see splat/config.py for every field, its type and range.  OUT
must be empty or hold this same run (``--resume``); ``--overwrite`` deletes
another run's outputs there first.  Mistakes print one line ``error: ...``
(exit code 1; 2 for bad flags); Ctrl+C and SIGTERM stop it with one line too
(exit codes 130 and 143), keeping the checkpoints written so far for
``--resume``; ``--debug`` shows the traceback instead.  The work is done by
splat.trainer.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from .config import packaged_configs

# The folder above the package: a checkout's root, whose data/sample_scene (the
# configs' data.path) is then found from any folder.  In an installed wheel it
# is site-packages, which holds no data/, so nothing is found there.
CHECKOUT = Path(__file__).resolve().parents[1]


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The flags of ``splat train`` / ``train.py`` (``prog``: the name in the usage line)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="scene folder (default: data.path of the config)")
    p.add_argument("--out", default=None, help="output folder (default: output/<scene folder name>)")
    p.add_argument(
        "--config",
        default=None,
        help=f"YAML config file, or a packaged config: {', '.join(packaged_configs())} "
        "(default: default, or OUT/config.yaml with --resume)",
    )
    p.add_argument("--iterations", type=int, default=None, help="override train.iterations")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue this run from OUT's newest checkpoint")
    mode.add_argument("--overwrite", action="store_true", help="delete the outputs of any run in OUT first")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force the progress bar on (--progress) or plain log lines (--no-progress); "
        "default: log.progress, 'auto' in the configs: a bar only when stderr is a terminal",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument(
        "--viewer", action="store_true", help='serve the live viewer while training (pip install -e ".[viewer]")'
    )
    p.add_argument("--viewer-port", type=int, default=8080, help="viewer port (default 8080; a free one if taken)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    return p


def run(args: argparse.Namespace) -> int:
    """Train as the parsed flags say (errors propagate; :func:`main` prints them)."""
    from .config import load_config
    from .trainer import Trainer

    out = Path(args.out) if args.out else None
    config = args.config
    if config is None:
        if args.resume and out is not None and (out / "config.yaml").is_file():
            config = str(out / "config.yaml")  # resume with the run's own settings
        else:
            config = "default"  # the packaged default.yaml
    overrides = list(args.overrides)
    if args.data is not None:
        overrides.append(f"data.path={args.data}")
    if args.iterations is not None:
        overrides.append(f"train.iterations={args.iterations}")
    if args.progress is not None:
        overrides.append(f"log.progress={'true' if args.progress else 'false'}")
    cfg = load_config(config, overrides)
    data = Path(cfg["data"]["path"])
    if not data.is_absolute() and not data.exists() and (CHECKOUT / data).exists():
        cfg["data"]["path"] = str(CHECKOUT / data)  # e.g. the bundled data/sample_scene from another cwd
    if out is None:
        out = Path("output") / Path(cfg["data"]["path"]).resolve().name
    if args.viewer:
        from .distributed import launched_ranks
        from .errors import ConfigError

        if launched_ranks() > 1:
            raise ConfigError(
                f"--viewer: not available with {launched_ranks()} processes (the live viewer needs "
                "the whole model in one process); open a checkpoint with view.py --model OUT instead"
            )
        from .viewer.training import train_with_viewer

        return train_with_viewer(cfg, out, resume=args.resume, overwrite=args.overwrite, port=args.viewer_port)
    Trainer(cfg, out, resume=args.resume, overwrite=args.overwrite).train()
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """CLI entry (module doc): the exit code."""
    args = build_parser(prog).parse_intermixed_args(argv)  # key=value may stand between flags
    from .data import DataError
    from .errors import run_cli
    from .sfm.sigterm import sigterm_as_interrupt

    return run_cli(sigterm_as_interrupt(lambda: run(args), args.debug), debug=args.debug, extra=(DataError,))
