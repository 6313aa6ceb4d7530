"""A live web viewer for splat models (viser), for ``view.py`` and ``train.py --viewer``.

viser is an optional extra (``pip install -e ".[viewer]"``); importing
:mod:`splat.viewer` works without it, and :func:`require_viser` turns its
absence into a one-line error.  Every picture on the page is rendered by the
public :func:`splat.rasterize` (through :func:`splat.model_render.render_frame`)
and sent to the browser as the scene's background image: the page has no
renderer of its own.
"""

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


def __getattr__(name):  # lazy: splat.viewer.ViewerServer imports viser only when asked for
    if name in ("ViewerServer", "TrainingView"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)
