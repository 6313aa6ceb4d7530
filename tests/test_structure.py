"""Package structure: no import cycles between splat's modules.

Every ``import`` statement counts, including the lazy ones inside functions
(a lazy import hides a cycle, it does not remove it).  Not counted: a
package's ``__init__`` importing its own submodules (it is their namespace:
``splat/__init__.py`` re-exports ``splat.rasterize``, ``splat.strategy``
builds ``splat.strategy.default`` by name).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "splat"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set) -> set:
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = ".".join(base[: len(base) - node.level + 1])
                mod = f"{root}.{node.module}" if node.module else root
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            own_submodule = is_pkg and t.startswith(name + ".")
            if t in modules and t != name and not own_submodule:
                out.add(t)
    return out


def import_graph() -> dict:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    modules = set(files)
    return {m: _imports(p, m, modules) for m, p in files.items()}


def find_cycle(graph: dict):
    """One import cycle as a list of modules, or None."""
    state = {}  # 1 visiting, 2 done

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                c = visit(n, stack)
                if c:
                    return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            c = visit(m, [])
            if c:
                return c
    return None


def test_find_cycle_detects_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_in_splat():
    graph = import_graph()
    assert "splat.trainer" in graph and "splat.model_render" in graph["splat.trainer"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


#: The most lines a class in splat/ may span (its docstring and methods):
#: a larger one does several jobs, which belong in modules of their own.
MAX_CLASS_LINES = 300
#: Classes still over the bound, each to be split (then removed from here).
OVER_MAX_CLASS_LINES = {"splat/viewer/server.py:ViewerServer"}


def test_no_class_in_splat_is_over_300_lines():
    big = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = f"{path.relative_to(PKG.parent)}:{getattr(node, 'name', '')}"
            if (isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
                    and name not in OVER_MAX_CLASS_LINES):
                big.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} "
                           f"({node.end_lineno - node.lineno + 1} lines)")
    assert not big, "classes over %d lines: %s" % (MAX_CLASS_LINES, ", ".join(big))


def test_no_two_modules_in_splat_share_a_name_with_render():
    """One module per name among the ones about rendering (render.py is the
    command line; the library's modules say what they hold)."""
    names = [p.stem for p in PKG.rglob("*.py") if p.stem == "render"]
    assert not names, [str(p) for p in PKG.rglob("render.py")]

