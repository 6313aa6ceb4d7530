"""CONTRIBUTING.md's layout block (the ```text block under "## Layout") is
the tree: every path it names exists, and it names every top-level script
and folder and every module, package and folder directly under ``splat/``.

The block's format: one entry a line, its path first, then its description;
an entry indented by two spaces more than a folder entry (``splat/``) is
inside that folder.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
#: Folders directly under splat/ (or the top level) that hold no source: caches and build outputs.
NOT_SOURCE = {"__pycache__", "build", "dist", "site"}


def layout_entries(markdown: str) -> list:
    """The repository-relative paths the layout block names, in order."""
    m = re.search(r"^## Layout\n+```text\n(.*?)^```", markdown, re.M | re.S)
    assert m, "CONTRIBUTING.md has no ```text block right under '## Layout'"
    entries, parents = [], []  # parents: (indent, folder path) of the enclosing folder entries
    for line in m.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        name = line.split()[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + name
        entries.append(path.rstrip("/"))
        if name.endswith("/"):
            parents.append((indent, path))
    return entries


def _files() -> list:
    """Repository-relative paths of the files in the tree: tracked and new ones
    (not ignored) in a git checkout, else every file outside hidden folders."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
        ).stdout.decode()
        return [p for p in out.split("\0") if p and (ROOT / p).exists()]
    except (OSError, subprocess.CalledProcessError):
        return [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        ]


def expected_entries(files: list) -> set:
    """What the block must name: top-level ``*.py`` scripts and non-hidden
    folders, and every module (but ``__init__.py``), package and folder
    directly under ``splat/`` (compiled extensions are build outputs)."""
    want = set()
    for path in files:
        parts = path.split("/")
        if parts[0].startswith(".") or parts[0] in NOT_SOURCE:
            continue
        if len(parts) == 1:
            if path.endswith(".py"):
                want.add(path)
        else:
            want.add(parts[0])
        if parts[0] == "splat" and len(parts) >= 2 and parts[1] not in NOT_SOURCE:
            if len(parts) > 2:
                want.add(f"splat/{parts[1]}")
            elif parts[1].endswith(".py") and parts[1] != "__init__.py":
                want.add(path)
    return want


def test_layout_block_parses_into_nested_paths():
    block = (
        "## Layout\n\n```text\ntrain.py   CLI\nsplat/\n  model.py   parameters\n  data/      loaders\n"
        "    colmap.py  COLMAP\n  sh.py  SH\n.ci/run    CI\n```\n"
    )
    assert layout_entries(block) == [
        "train.py",
        "splat",
        "splat/model.py",
        "splat/data",
        "splat/data/colmap.py",
        "splat/sh.py",
        ".ci/run",
    ]


def test_layout_block_names_the_tree():
    named = layout_entries(CONTRIBUTING.read_text())
    stale = [p for p in named if not (ROOT / p).exists()]
    duplicated = sorted({p for p in named if named.count(p) > 1})
    missing = sorted(expected_entries(_files()) - set(named))
    problems = []
    if stale:
        problems.append("names paths that do not exist: " + ", ".join(stale))
    if missing:
        problems.append("leaves out: " + ", ".join(missing))
    if duplicated:
        problems.append("names twice: " + ", ".join(duplicated))
    assert not problems, "CONTRIBUTING.md's layout block (```text under '## Layout') " + "; ".join(problems)
