"""The config reference of the docs, generated from ``splat/config.py``.

Every field of the dataclasses there (type, default, allowed range, help
text from its ``_f(...)`` declaration), with the value each file in
``configs/`` sets.  Run at every docs build (``docs/_build/hooks.py``), so
the page cannot drift from the code.

    python docs/_build/config_reference.py    # prints the Markdown
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _yaml_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '""' if v == "" else v
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_text(x) for x in v) + "]"
    return repr(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_text(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return " or ".join(_type_text(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " \\| ".join(f"`{_yaml_text(a)}`" for a in typing.get_args(tp))
    if origin in (list, typing.List):
        return f"list of {typing.get_args(tp)[0].__name__}"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(tp, str(tp))


def _range_text(meta) -> str:
    parts = [f"{sym} {meta[name]:g}" if isinstance(meta[name], float) else f"{sym} {meta[name]}"
             for name, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")) if name in meta]
    if "length" in meta:
        parts.append(f"{meta['length']} values")
    if "pattern" in meta:
        parts.append(f"matches `{meta['pattern']}`")
    return ", ".join(parts)


def fields(cls=None, prefix=""):
    """(dotted key, type, dataclass field) of every leaf field, in declaration order."""
    from splat.config import SplatConfig

    cls = cls or SplatConfig
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from fields(tp, prefix + f.name + ".")
        else:
            yield prefix + f.name, tp, f


def _value(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def markdown() -> str:
    from splat.config import DEFAULT_CONFIG, load_config

    files = sorted((ROOT / "configs").glob("*.yaml"))
    loaded = {p.name: load_config(str(p)) for p in files}
    head = ["key", "type", "code default"] + [f"`{name}`" for name in loaded] + ["range", "meaning"]
    out = []
    section = None
    for key, tp, f in fields():
        top = key.rsplit(".", 1)[0] if "." in key else "(top level)"
        if top != section:
            section = top
            out += ["", f"### `{section}`" if "." in key else f"### {section}", "",
                    "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        default = _value(DEFAULT_CONFIG, key)
        row = [f"`{key}`", _type_text(tp), f"`{_yaml_text(default)}`"]
        for cfg in loaded.values():
            v = _value(cfg, key)
            row.append(f"`{_yaml_text(v)}`" if v != default or type(v) is not type(default) else "=")
        row += [_range_text(f.metadata), _cell(f.metadata.get("doc", ""))]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out).lstrip("\n") + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
