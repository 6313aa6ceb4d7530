"""What every bench script prints: the machine it ran on, and the report as
JSON on stdout (and in --out).  Imported as ``from report import ...`` by the
scripts in this folder (run as ``python bench/NAME.py``)."""
from __future__ import annotations

import json
import os
import platform
import subprocess


def machine(**extra) -> dict:
    import torch

    return dict(platform=platform.platform(), processor=platform.processor(), cpus=os.cpu_count(),
                load_average=os.getloadavg(), torch=torch.__version__, cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, **extra)


def commit(root: str):
    """Short commit hash of the code tree at `root` (None outside git)."""
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


def emit(report: dict, out=None) -> None:
    text = json.dumps(report, indent=2)
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
    result = json.loads(lines[-1][len(_RESULT):]) if proc.returncode == 0 and lines else None
    return result, proc
