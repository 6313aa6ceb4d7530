"""A live web viewer for splat models (viser), for ``view.py`` and ``train.py --viewer``.

viser is an optional extra (``pip install -e ".[viewer]"``); importing
:mod:`splat.viewer` works without it, and :func:`require_viser` turns its
absence into a one-line error.  Every picture on the page is rendered by the
public :func:`splat.rasterize` (through :func:`splat.model_render.render_frame`)
and sent to the browser as the scene's background image: the page has no
renderer of its own.
"""

from __future__ import annotations

from .optional_viser import VISER_MISSING, ViewerUnavailable, require_viser  # noqa: F401 (public names)


def __getattr__(name):  # lazy: splat.viewer.ViewerServer imports viser only when asked for
    if name in ("ViewerServer", "TrainingView"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)
