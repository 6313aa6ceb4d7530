"""Error classes for mistakes a user can make (bad config, data, folders).

``train.py`` and ``render.py`` catch :class:`SplatInputError` (and the data
loaders' :class:`splat.data.DataError`) and print one line ``error: <message>``
with no traceback, so every message must name the file, key or value at fault.
Raise these only for problems the user can fix; bugs stay ordinary exceptions.
"""

from __future__ import annotations

import sys
from typing import Callable, Tuple

__all__ = [
    "SplatInputError",
    "ConfigError",
    "RunStateError",
    "RankLostError",
    "format_error",
    "interrupt_behind",
    "run_cli",
]


class SplatInputError(ValueError):
    """Bad user input: the message names the file / key / value and what is wrong."""


class ConfigError(SplatInputError):
    """A config file or ``key=value`` override is missing, unparsable, has an
    unknown key, or a value of the wrong type or out of range."""


class RunStateError(SplatInputError):
    """The output folder cannot be used for this run (it holds another run,
    is a file, is read-only, or its checkpoint does not fit the config)."""


class RankLostError(RuntimeError):
    """Multi-process training: another rank died or stopped answering (the
    message names it); this rank stops, and ``--resume`` continues from the
    last complete checkpoint."""


def format_error(e: BaseException) -> str:
    """One line for ``error: ...``: OSErrors name their file, newlines are folded."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        msg = f"{e.filename}: {e.strerror}"
    else:
        msg = str(e) or type(e).__name__
        if isinstance(e, KeyError) and len(e.args) == 1:
            msg = str(e.args[0])
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())


def interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (Ctrl+C, or SIGTERM's ``Terminated``) that ``e``
    is, or was raised while handling (a library's clean-up can fail on the
    state the interrupt left: torch.save's zip writer does), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__context__
    return None


def run_cli(fn: Callable[[], int], debug: bool = False, extra: Tuple[type, ...] = ()) -> int:
    """``fn()``, with every user-caused failure (SplatInputError, OSError,
    ValueError, ``extra``) printed as one line ``error: ...`` and exit code 1
    instead of a traceback, and Ctrl+C (or an error raised while handling it)
    as ``error: interrupted``, exit code 130; ``debug=True`` re-raises (full
    traceback)."""
    try:
        return int(fn() or 0)
    except BaseException as e:
        if debug:
            raise
        if isinstance(e, RankLostError):
            print(f"error: {format_error(e)}", file=sys.stderr)
            return 1
        if interrupt_behind(e) is not None:
            print("error: interrupted", file=sys.stderr)
            return 130
        if isinstance(e, (SplatInputError, OSError, ValueError, *extra)):
            print(f"error: {format_error(e)}", file=sys.stderr)
            return 1
        raise
