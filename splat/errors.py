"""Error classes for mistakes a user can make (bad config, data, folders).

``train.py`` and ``render.py`` catch :class:`SplatInputError` (and the data
loaders' :class:`splat.data.DataError`) and print one line ``error: <message>``
with no traceback, so every message must name the file, key or value at fault.
Raise these only for problems the user can fix; bugs stay ordinary exceptions.
"""

from __future__ import annotations

__all__ = ["SplatInputError", "ConfigError", "RunStateError"]


class SplatInputError(ValueError):
    """Bad user input: the message names the file / key / value and what is wrong."""


class ConfigError(SplatInputError):
    """A config file or ``key=value`` override is missing, unparsable, has an
    unknown key, or a value of the wrong type or out of range."""


class RunStateError(SplatInputError):
    """The output folder cannot be used for this run (it holds another run,
    is a file, is read-only, or its checkpoint does not fit the config)."""
