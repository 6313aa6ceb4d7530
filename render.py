#!/usr/bin/env python
"""Render a trained model: ``python render.py --model OUT [--data DIR] --split test``
writes OUT/renders/test/{rgb,depth,normal,alpha}/<stem>.*; ``--mesh`` fuses the
train views' depth into OUT/mesh.ply with open3d.  See splat/render_cli.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from a checkout without installing

if __name__ == "__main__":
    try:
        from splat.render_cli import main

        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl+C during the imports (torch: seconds), before run_cli's handler is in place
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
