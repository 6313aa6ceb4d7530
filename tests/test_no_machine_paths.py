"""The repository names no folder of the machines it was built on.

* No tracked text file holds a development machine's absolute path: a path
  inside a home or work folder (under ``/work``, ``/root`` or ``/home``) or
  inside a git mirror's ``.mirror`` folder.  Example commands may still use
  ``/tmp/old`` or ``/data/scenes/mine``: those name no machine.
* Recorded results (``bench/results/``) hold no absolute path at all: the
  bench scripts record paths relative to the repository, or a scene's or
  output folder's name (``bench/report.py``'s ``portable``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from report import portable, portable_path  # noqa: E402

#: A machine's folder followed by a name inside it (so that a test asserting
#: the bare prefix is absent, like ``"/work/" not in text``, is not one).
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home)/[\w.+-]|\.mirror/[\w.+-]")
#: Any absolute POSIX path: a "/" that starts a token, or follows a one-letter
#: option glued to it ("-I/usr/include"), then a name.
ABSOLUTE_PATH = re.compile(r"(?:(?<=^-[A-Za-z])|(?<=[\s\"'=]-[A-Za-z])|(?<![\w.~/:-]))/[\w.+@%-]+")


def _tracked_text_files():
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (images, PLY)
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def _hits(pattern, text):
    return [
        (text.count("\n", 0, m.start()) + 1, text[m.start() : m.start() + 60].splitlines()[0])
        for m in pattern.finditer(text)
    ]


def test_no_tracked_file_names_a_machine_folder():
    found = [
        f"{name}:{line}: {snippet}"
        for name, text in _tracked_text_files()
        for line, snippet in _hits(MACHINE_PATH, text)
    ]
    assert not found, (
        "absolute paths of a development machine (write them relative to the repository, "
        "or as a placeholder like DIR):\n" + "\n".join(found)
    )


def test_recorded_results_hold_no_absolute_path():
    found = [
        f"{name}:{line}: {snippet}"
        for name, text in _tracked_text_files()
        if name.startswith("bench/results/")
        for line, snippet in _hits(ABSOLUTE_PATH, text)
    ]
    assert not found, (
        "absolute paths in recorded results (bench/report.py's portable() rewrites them; "
        "rewrite a stored file the same way):\n" + "\n".join(found)
    )


def test_portable_paths_name_no_machine_folder():
    root = "/srv/checkout/splat"
    assert portable_path(root, root) == "."
    assert portable_path(f"{root}/bench/results/x.json", root) == "bench/results/x.json"
    assert portable_path("/srv/data/scenes/still_life", root) == "still_life"
    assert portable_path("/scratch/runs/fast/mesh.ply", root) == "fast/mesh.ply"
    assert portable_path("../scenes/still_life", root) == "../scenes/still_life"
    report = {
        "command": "python bench/quality.py --shared /srv/data --out /scratch/q/fast.json -- "
        "data.path=/srv/data/scenes/fox",
        "compile": f"g++ -I{root}/splat/kernels -I/usr/local/cuda/include -O3 -fPIC",
        "commits": {root: "abc1234", "/scratch/old": "c95de2c"},
        "rate": "3.1 it/s",
        "url": "https://github.com/hbb1/diff-surfel-rasterization",
        "n": 3,
    }
    assert portable(report, root) == {
        "command": "python bench/quality.py --shared data --out q/fast.json -- data.path=fox",
        "compile": "g++ -Isplat/kernels -Iinclude -O3 -fPIC",
        "commits": {".": "abc1234", "old": "c95de2c"},
        "rate": "3.1 it/s",
        "url": "https://github.com/hbb1/diff-surfel-rasterization",
        "n": 3,
    }


def test_portable_refuses_keys_that_collide():
    """Two runs of one scene in different folders share a last component:
    a report keyed by their paths must not keep one entry in place of two."""
    with pytest.raises(ValueError, match="still_life_default_auto"):
        portable({"/scratch/a/still_life_default_auto": 1, "/scratch/b/still_life_default_auto": 2}, "/srv/splat")
