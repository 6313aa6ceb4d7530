"""The ``splat`` command: ``splat train``, ``splat render``, ``splat view``, ``splat convert``.

Each command has exactly the flags of the script of the same name in a
checkout (``train.py`` ...): both call the same ``main`` of
``splat/<command>_cli.py``.  ``python -m splat`` is the same command.  An
unknown command is one line ``error: ...`` (exit code 2, as for bad flags).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Dict, Optional, Sequence, Tuple

from . import __version__

# command -> (module with main(argv, prog), one line for ``splat --help``)
COMMANDS: Dict[str, Tuple[str, str]] = {
    "train": ("splat.train_cli", "train a model on a scene folder (train.py)"),
    "render": ("splat.render_cli", "render a trained model's views, or extract its mesh (render.py)"),
    "view": ("splat.view_cli", "fly around a trained model in the browser (view.py)"),
    "convert": ("splat.convert_cli", "photos -> a COLMAP scene folder, with pycolmap (convert.py)"),
}


def usage() -> str:
    """``splat --help``: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = [
        "usage: splat [-h] [--version] COMMAND [flags]",
        "",
        "Differentiable Gaussian splatting: train, render, view and convert scenes.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()),
        "",
        "options:",
        "  -h, --help  show this help message and exit",
        "  --version   show splat's version and exit",
        "",
        "'splat COMMAND --help' lists a command's flags.",
    ]
    return "\n".join(lines)


def run_command(name: str, argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Exit code of command ``name`` with flags ``argv`` (None: ``sys.argv[1:]``);
    ``prog`` names it in its usage line (None: the script's file name)."""
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(argv, prog=prog)


def unknown_command(word: str) -> str:
    """The one-line error for ``splat WORD`` when WORD is no command."""
    close = difflib.get_close_matches(word, list(COMMANDS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"error: unknown command {word!r} (commands: {', '.join(COMMANDS)}; see splat --help){hint}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``splat COMMAND [flags]``: the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    first, rest = argv[0], argv[1:]
    if first in ("-h", "--help"):
        print(usage())
        return 0
    if first == "--version":
        print(f"splat {__version__}")
        return 0
    if first not in COMMANDS:
        print(unknown_command(first), file=sys.stderr)
        return 2
    try:
        return run_command(first, rest, prog=f"splat {first}")
    except KeyboardInterrupt:  # Ctrl+C while the command's modules load, before its handler is in place
        print("error: interrupted", file=sys.stderr)
        return 130
