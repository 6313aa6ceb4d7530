#!/usr/bin/env python
"""Train a 2D-Gaussian-surfel model.

    python train.py                                   # data/sample_scene -> output/sample_scene, default config
    python train.py --data DIR --out OUT --config configs/fast.yaml --iterations 3000 loss.dist_lambda=0
    python train.py --out OUT --resume                # continue OUT from its newest checkpoint

``key=value`` arguments override any config field (dotted keys for nested
sections, values parsed as YAML); see splat/config.py for every field,
its type and range.  The work is done by splat.trainer.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def main(argv=None) -> int:
    from splat.config import load_config
    from splat.trainer import Trainer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="scene folder (default: data.path of the config)")
    p.add_argument("--out", default=None, help="output folder (default: output/<scene folder name>)")
    p.add_argument("--config", default=None,
                   help="YAML config (default: configs/default.yaml, or OUT/config.yaml with --resume)")
    p.add_argument("--iterations", type=int, default=None, help="override train.iterations")
    p.add_argument("--resume", action="store_true", help="continue from OUT's newest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = p.parse_args(argv)

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
    if args.no_progress:
        overrides.append("log.progress=false")
    try:
        cfg = load_config(config, overrides)
    except (KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    data = Path(cfg["data"]["path"])
    if not data.is_absolute() and not data.exists() and (ROOT / data).exists():
        cfg["data"]["path"] = str(ROOT / data)  # e.g. the bundled data/sample_scene from another cwd
    if out is None:
        out = Path("output") / Path(cfg["data"]["path"]).resolve().name
    from splat.data import DataError

    try:
        Trainer(cfg, out, resume=args.resume).train()
    except (DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
