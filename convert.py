#!/usr/bin/env python
"""``splat convert`` without installing: the same flags (``python convert.py --help``); see splat/convert_cli.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from a checkout without installing


def main(argv=None) -> int:
    from splat.cli import run_command

    return run_command("convert", argv)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl+C while torch loads, before the command's handler is in place
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
