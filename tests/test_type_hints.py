"""Public functions carry type hints on every argument and their return
(the API reference's Type column and signatures come from them).

Checked over the modules in :data:`HINTED`: a public function or method (no
leading underscore; ``__init__`` included) of one of them that leaves an
argument or its return unannotated fails, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Files and folders (every .py below) under splat/ whose public API is fully hinted.
HINTED = (
    "data",
    "mesh",
    "viewer",
    "sfm",
    "appearance.py",
    "conventions.py",
    "devices.py",
    "errors.py",
    "keyed_random.py",
    "losses.py",
    "optimizers.py",
    "progress.py",
    "testing.py",
)


def _files():
    for name in HINTED:
        path = ROOT / "splat" / name
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def unhinted(path: Path) -> list:
    """``file:line name (what)`` for each public function of ``path`` missing a hint."""
    out = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                a = node.args
                missing = [
                    x.arg
                    for x in a.posonlyargs + a.args + a.kwonlyargs
                    if x.annotation is None and x.arg not in ("self", "cls")
                ]
                missing += [f"*{x.arg}" for x in (a.vararg, a.kwarg) if x is not None and x.annotation is None]
                if node.returns is None and node.name != "__init__":
                    missing.append("return")
                if missing:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {prefix}{node.name} ({', '.join(missing)})")

    visit(ast.parse(path.read_text()).body, "")
    return out


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT / "splat")))
def test_public_functions_are_hinted(path):
    missing = unhinted(path)
    assert not missing, "public functions without type hints:\n" + "\n".join(missing)
