"""Package structure: no import cycles between splat's modules.

Every ``import`` statement counts, including the lazy ones inside functions
(a lazy import hides a cycle, it does not remove it), and so does a
package's ``__init__``: its imports of its own submodules are edges like
any other, and ``from PKG import name`` depends on ``PKG``'s ``__init__``
unless ``name`` is a submodule (or a compiled extension) of PKG.  Importing
``a.b.c`` also runs the ``__init__`` of ``a.b`` and ``a``; that counts too,
except for the importing module's own enclosing packages (Python has begun
them before it).  So a submodule that takes a name from its package's
``__init__`` while that ``__init__`` imports the submodule is a cycle.
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


def _extension_modules() -> set:
    """Compiled modules (``splat/_C*.so``): importable, not parsed."""
    found = set()
    for pattern in ("*.so", "*.pyd"):
        for p in PKG.rglob(pattern):
            parts = list(p.relative_to(PKG.parent).parts)
            found.add(".".join(parts[:-1] + [parts[-1].split(".")[0]]))
    return found


def _imports(path: Path, name: str, modules: set, extensions: frozenset = frozenset()) -> set:
    """The modules of ``modules`` that module ``name`` (file ``path``)
    depends on (see the module doc)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    explicit = []  # modules whose body this import needs
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            explicit += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = ".".join(base[: len(base) - node.level + 1])
                mod = f"{root}.{node.module}" if node.module else root
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                # A submodule, or a name out of mod's own namespace (its __init__ for a package).
                explicit.append(sub if sub in modules or sub in extensions else mod)
    out = {t for t in explicit if t in modules and t != name}
    for t in explicit:  # the enclosing packages' __init__ run first, except this module's own
        out |= {p for p in _enclosing(t) if p in modules and not name.startswith(p + ".") and p != name}
    return out


def _enclosing(module: str) -> list:
    """The packages above ``module`` (``a.b.c`` -> ``a.b``, ``a``)."""
    parts = module.split(".")
    return [".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]


def import_graph() -> dict:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    modules = set(files)
    extensions = frozenset(_extension_modules())
    return {m: _imports(p, m, modules, extensions) for m, p in files.items()}


def find_cycle(graph: dict):
    """One import cycle as a list of modules, or None."""
    state = {}  # 1 visiting, 2 done

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
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


def test_no_class_in_splat_is_over_300_lines():
    big = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big.append(
                    f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} "
                    f"({node.end_lineno - node.lineno + 1} lines)"
                )
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {', '.join(big)}"


def test_no_two_modules_in_splat_share_a_name_with_render():
    """One module per name among the ones about rendering (render.py is the
    command line; the library's modules say what they hold)."""
    names = [p.stem for p in PKG.rglob("*.py") if p.stem == "render"]
    assert not names, [str(p) for p in PKG.rglob("render.py")]


def test_a_package_init_counts(tmp_path):
    """A submodule that imports a name from its package's ``__init__``,
    which imports the submodule (even lazily), is a cycle; a submodule
    imported by name from its package is not a dependency on the package."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def helper():\n    pass\n\ndef lazy():\n    from . import sub\n")
    (pkg / "sub.py").write_text("from . import helper\n")
    (pkg / "other.py").write_text("from . import sub\n")
    modules = {"pkg", "pkg.sub", "pkg.other"}
    assert _imports(pkg / "__init__.py", "pkg", modules) == {"pkg.sub"}
    assert _imports(pkg / "sub.py", "pkg.sub", modules) == {"pkg"}
    assert _imports(pkg / "other.py", "pkg.other", modules) == {"pkg.sub"}
    graph = {m: _imports(pkg / (m.split(".")[-1] + ".py" if "." in m else "__init__.py"), m, modules) for m in modules}
    assert find_cycle(graph) == ["pkg", "pkg.sub", "pkg"]
