"""What every bench script prints: the machine it ran on, and the report as
JSON on stdout (and in --out).  Imported as ``from report import ...`` by the
scripts in this folder (run as ``python bench/NAME.py``)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from pathlib import Path

#: The repository this script runs from: paths inside it are recorded relative to it.
ROOT = Path(__file__).resolve().parents[1]
#: An absolute POSIX path inside a string: a "/" that starts a token (not one
#: inside "bench/results", "../shared", "it/s" or a URL), or that follows a
#: one-letter option glued to it (a compiler's "-I/usr/include"), then path
#: characters.
_ABSOLUTE_PATH = re.compile(r"(?:(?<=^-[A-Za-z])|(?<=[\s\"'=]-[A-Za-z])|(?<![\w.~/:-]))/[\w.+@%-]+(?:/[\w.+@%-]+)*/?")


def machine(**extra) -> dict:
    import torch

    return dict(
        platform=platform.platform(),
        processor=platform.processor(),
        cpus=os.cpu_count(),
        load_average=os.getloadavg(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        **extra,
    )


def commit(root: str):
    """Short commit hash of the code tree at `root` (None outside git)."""
    try:
        return (
            subprocess.run(
                ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    except OSError:
        return None


def portable_path(path: str, root=ROOT) -> str:
    """``path`` as a results file records it, naming no folder of the machine
    it ran on: relative to the repository ``root`` when inside it (``"."``
    for the root itself), else its last component (a scene's name, an output
    folder's name; a file keeps its folder's name too).  Relative paths are
    kept as they are."""
    if not os.path.isabs(path):
        return path
    root = Path(root)
    for candidate in (Path(os.path.normpath(path)), Path(path).resolve()):
        try:
            rel = candidate.relative_to(root)
        except ValueError:
            continue
        return rel.as_posix() if rel.parts else "."
    plain = Path(os.path.normpath(path))
    if not plain.name:
        return path
    # A file keeps its folder's name: out/fast/mesh.ply and out/default/mesh.ply stay apart.
    return f"{plain.parent.name}/{plain.name}" if plain.suffix and plain.parent.name else plain.name


def portable(value, root=ROOT):
    """``value`` (a report: dicts, lists, strings, numbers) with every
    absolute path in its strings and keys replaced by :func:`portable_path`
    (a command line's ``--out /x/y.json`` and ``data.path=/x/scene`` too)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return _ABSOLUTE_PATH.sub(lambda m: portable_path(m.group(0), root), value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = portable(k, root)
            if key in out:  # two paths with the same last component: one entry would silently replace the other
                raise ValueError(f"report keys {k!r} and another both become {key!r}: name them apart")
            out[key] = portable(v, root)
        return out
    if isinstance(value, (list, tuple)):
        return [portable(v, root) for v in value]
    return value


def emit(report: dict, out=None) -> None:
    """Print ``report`` as JSON and write it to ``out``, its paths made
    portable (:func:`portable`): results are stored in the repository."""
    text = json.dumps(portable(report), indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


# ------------------------------------------------------------ child processes
#: The flag a bench script's child process takes: the case to run, as JSON.
CHILD_FLAG = "--child"
_RESULT = "RESULT "


def add_child_flag(parser) -> None:
    """Adds the hidden ``--child CASE_JSON`` flag that :func:`run_child` passes."""
    import argparse

    parser.add_argument(CHILD_FLAG, metavar="CASE_JSON", help=argparse.SUPPRESS)


def child_case(args):
    """The case dict this process was started with by :func:`run_child`, or None in the parent."""
    value = getattr(args, CHILD_FLAG.lstrip("-").replace("-", "_"))
    return None if value is None else json.loads(value)


def print_child_result(result: dict) -> None:
    """In the child: hands ``result`` back to :func:`run_child` (its last ``RESULT`` line on stdout)."""
    print(_RESULT + json.dumps(result), flush=True)


def run_child(script, case: dict, args=(), **popen):
    """Runs ``python SCRIPT ARGS --child CASE_JSON`` in a fresh process (its own
    peak memory, its own code tree with ``env``/``cwd``, no state carried over
    between cases) and returns ``(result, proc)``: the dict the child passed to
    :func:`print_child_result` (None if it failed or printed none) and the
    completed process (``returncode``, ``stdout``, ``stderr``).  ``popen``:
    ``subprocess.run`` keywords (``env``, ``cwd``, ``preexec_fn``)."""
    import sys

    cmd = [sys.executable, os.path.abspath(str(script)), *map(str, args), CHILD_FLAG, json.dumps(case)]
    proc = subprocess.run(cmd, capture_output=True, text=True, **popen)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT)]
    result = json.loads(lines[-1][len(_RESULT) :]) if proc.returncode == 0 and lines else None
    return result, proc
