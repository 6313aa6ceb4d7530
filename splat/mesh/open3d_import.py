"""Importing open3d, with an error that says what to do when it cannot load.

open3d is an optional dependency (the ``mesh`` extra: ``open3d-cpu``).  A
wheel that is installed can still fail to import: it links system libraries
a fresh Linux machine may lack (``libusb-1.0.so.0``, ``libGL.so.1``,
``libEGL.so.1``, ``libX11.so.6``, ``libgomp.so.1``).  Telling that user to
``pip install open3d`` sends them in a circle, so the message names the
missing library and the system package that provides it.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Optional

#: Shared libraries open3d's Linux wheels link that a minimal Debian/Ubuntu
#: lacks, and the apt package of each.
SYSTEM_PACKAGES = {
    "libusb-1.0.so.0": "libusb-1.0-0",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libX11.so.6": "libx11-6",
    "libgomp.so.1": "libgomp1",
}

#: The pip command of the mesh extra (setup.py ``extras_require["mesh"]``).
PIP_HINT = "pip install open3d-cpu"


class MissingOpen3D(RuntimeError):
    """open3d is not installed, or is installed and cannot load."""


def missing_library(message: str) -> Optional[str]:
    """The shared library named in a loader error (``libX.so.N: cannot open
    shared object file``), or None."""
    m = re.search(r"([\w.+-]+\.so(?:\.[\w.]+)?): cannot open shared object file", message)
    return m.group(1) if m else None


def explain_import_error(error: BaseException) -> str:
    """One line: what is missing and the command that installs it."""
    text = str(error)
    lib = missing_library(text)
    if lib is not None:
        pkg = SYSTEM_PACKAGES.get(lib)
        how = f"sudo apt-get install {pkg}" if pkg else "install the system package that provides it"
        return f"open3d is installed but cannot load {lib}, a system library it needs: {how}"
    if isinstance(error, ModuleNotFoundError):
        return f"open3d is not installed: {PIP_HINT}"
    return f"open3d cannot be imported ({text.splitlines()[0] if text else type(error).__name__})"


def import_open3d(purpose: str = "meshing") -> ModuleType:
    """The ``open3d`` module, or :class:`MissingOpen3D` with a one-line fix."""
    try:
        import open3d
    except (ImportError, OSError) as e:
        raise MissingOpen3D(f"{purpose} needs open3d: {explain_import_error(e)}") from e
    return open3d
