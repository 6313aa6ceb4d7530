"""SIGTERM like Ctrl+C in the command-line tools, also once pycolmap is imported.

Importing pycolmap installs glog's failure-signal handler, and SIGTERM is
one of the signals it takes: a plain ``kill`` of ``convert.py``, or of
``train.py`` while it triangulates with pycolmap, printed a ~30-line native
stack trace (``*** Aborted at ... SIGTERM received``) that looks like a
crash, and nothing was cleaned up.  :func:`sigterm_as_interrupt` makes
SIGTERM raise :class:`Terminated`, a KeyboardInterrupt, in the main thread,
so that every clean-up Ctrl+C runs (a run folder's lock released, convert's
work folder removed, the viewer closed) runs for it too, and the tool ends
with one line ``error: terminated (SIGTERM)`` and exit code 143 (128 + 15,
the shells' convention).  Its handler is installed again right after
pycolmap is imported, by whichever module imports it, since that import
replaces it.  Like Ctrl+C, the signal takes effect when the main thread next
runs Python code or pycolmap checks for interrupts.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import signal
import sys
import threading
from typing import Callable

from ..errors import interrupt_behind

__all__ = ["Terminated", "sigterm_as_interrupt", "EXIT_CODE"]

#: Exit code of a tool stopped by SIGTERM.
EXIT_CODE = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread like Ctrl+C's KeyboardInterrupt."""


def _raise_terminated(signum, frame):
    raise Terminated()


class _ReinstallAfterPycolmap(importlib.abc.MetaPathFinder):
    """Finds ``pycolmap`` with the other finders and wraps its loader so that
    the SIGTERM handler is installed again once the module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "pycolmap":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_reinstall(module):
            exec_module(module)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, _raise_terminated)  # glog's replaced ours

        loader.exec_module = exec_then_reinstall  # this spec's own loader object
        return spec


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises :class:`Terminated` inside the block (main thread only);
    the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():  # signal.signal works only there
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    hook = _ReinstallAfterPycolmap()
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        sys.meta_path.remove(hook)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def sigterm_as_interrupt(fn: Callable[[], int], debug: bool = False) -> Callable[[], int]:
    """``fn`` wrapped for :func:`splat.errors.run_cli`: SIGTERM while it runs
    ends it like Ctrl+C and returns :data:`EXIT_CODE` after one line
    ``error: terminated (SIGTERM)`` (``debug``: the traceback instead)."""

    def run() -> int:
        try:
            with _sigterm_raises():
                return fn()
        except BaseException as e:
            # An error raised while handling Terminated (a clean-up failing
            # on what the interrupt left) is the termination too.
            if debug or not isinstance(interrupt_behind(e), Terminated):
                raise
            print("error: terminated (SIGTERM)", file=sys.stderr)
            return EXIT_CODE

    return run
