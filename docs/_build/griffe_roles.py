"""A griffe extension: splat's docstrings, written for plain text and Sphinx,
read well as Markdown in the API reference.

* Sphinx roles (``:func:`~splat.x.y```, ``:class:``, ``:mod:`` ...) become
  code spans (``y`` with the ``~``, the full name without);
* ``Text::`` (a reST literal-block marker) becomes ``Text:``, the indented
  block after it staying a code block;
* reST simple tables (rows of ``====`` rules) become fenced text blocks.

Only the rendering changes; the docstrings in the code stay as they are.
"""
from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")
RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _role(m):
    name = m.group(2)
    return f"`{name.rsplit('.', 1)[-1]}`" if m.group(1) else f"`{name}`"


def _tables(lines):
    """Wraps each reST simple table (three rule lines: top, under the header, bottom) in a fence."""
    out, i = [], 0
    while i < len(lines):
        if RULE.match(lines[i]):
            rules = [j for j in range(i, len(lines)) if RULE.match(lines[j])][:3]
            if len(rules) == 3:
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                out += [indent + "```text", *lines[i:rules[2] + 1], indent + "```"]
                i = rules[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def markdown_docstring(text: str) -> str:
    text = ROLE.sub(_role, text)
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)
    text = re.sub(r"^(\s*)::$", "", text, flags=re.M)
    return "\n".join(_tables(text.split("\n")))


class SphinxRolesToMarkdown(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
