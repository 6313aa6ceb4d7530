"""viser, the optional ``viewer`` extra: imported on demand, its absence a
one-line error."""

from __future__ import annotations

from types import ModuleType

from ..errors import SplatInputError

VISER_MISSING = 'viser is not installed: pip install -e ".[viewer]"'


class ViewerUnavailable(SplatInputError):
    """viser (the optional ``viewer`` extra) cannot be imported."""


def require_viser() -> ModuleType:
    """The ``viser`` module, or :class:`ViewerUnavailable` with the install command."""
    try:
        import viser
    except ImportError as e:
        raise ViewerUnavailable(f"{VISER_MISSING} ({e})") from None
    return viser
