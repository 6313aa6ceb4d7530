"""``python -m splat``: the ``splat`` command (:mod:`splat.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
