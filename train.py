#!/usr/bin/env python
"""Train a 2D-Gaussian-surfel model.

    python train.py                                   # data/sample_scene -> output/sample_scene, default config
    python train.py --data DIR --out OUT --config configs/fast.yaml --iterations 3000 loss.dist_lambda=0
    python train.py --out OUT --resume                # continue OUT from its newest checkpoint
    python train.py --out OUT --resume train.iterations=8000   # ... and train longer

``key=value`` arguments override any config field (dotted keys for nested
sections, values parsed as YAML; they may stand anywhere among the flags);
see splat/config.py for every field, its type and range.  OUT must be empty
or hold this same run (``--resume``); ``--overwrite`` deletes another run's
outputs there first.  Mistakes print one line ``error: ...`` (exit code 1;
2 for bad flags); Ctrl+C and SIGTERM stop it with one line too (exit codes
130 and 143), keeping the checkpoints written so far for ``--resume``;
``--debug`` shows the traceback instead.  The work is done by splat.trainer.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="scene folder (default: data.path of the config)")
    p.add_argument("--out", default=None, help="output folder (default: output/<scene folder name>)")
    p.add_argument(
        "--config", default=None, help="YAML config (default: configs/default.yaml, or OUT/config.yaml with --resume)"
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


def run(args) -> int:
    from splat.config import load_config
    from splat.trainer import Trainer

    out = Path(args.out) if args.out else None
    config = args.config
    if config is None:
        if args.resume and out is not None and (out / "config.yaml").is_file():
            config = str(out / "config.yaml")  # resume with the run's own settings
        elif (ROOT / "configs" / "default.yaml").is_file():
            config = str(ROOT / "configs" / "default.yaml")
    overrides = list(args.overrides)
    if args.data is not None:
        overrides.append(f"data.path={args.data}")
    if args.iterations is not None:
        overrides.append(f"train.iterations={args.iterations}")
    if args.progress is not None:
        overrides.append(f"log.progress={'true' if args.progress else 'false'}")
    cfg = load_config(config, overrides)
    data = Path(cfg["data"]["path"])
    if not data.is_absolute() and not data.exists() and (ROOT / data).exists():
        cfg["data"]["path"] = str(ROOT / data)  # e.g. the bundled data/sample_scene from another cwd
    if out is None:
        out = Path("output") / Path(cfg["data"]["path"]).resolve().name
    if args.viewer:
        from splat.distributed import launched_ranks
        from splat.errors import ConfigError

        if launched_ranks() > 1:
            raise ConfigError(
                f"--viewer: not available with {launched_ranks()} processes (the live viewer needs "
                "the whole model in one process); open a checkpoint with view.py --model OUT instead"
            )
        from splat.viewer.training import train_with_viewer

        return train_with_viewer(cfg, out, resume=args.resume, overwrite=args.overwrite, port=args.viewer_port)
    Trainer(cfg, out, resume=args.resume, overwrite=args.overwrite).train()
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # key=value may stand between flags
    from splat.data import DataError
    from splat.errors import run_cli
    from splat.sfm.sigterm import sigterm_as_interrupt

    return run_cli(sigterm_as_interrupt(lambda: run(args), args.debug), debug=args.debug, extra=(DataError,))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl+C during the imports (torch: seconds), before run_cli's handler is in place
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
