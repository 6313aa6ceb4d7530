#!/usr/bin/env python
"""``splat render`` without installing: the same flags (``python render.py --help``); see splat/render_cli.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from a checkout without installing


def main(argv=None) -> int:
    from splat.cli import run_command

    return run_command("render", argv)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl+C while torch loads, before the command's handler is in place
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
