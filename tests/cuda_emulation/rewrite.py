"""Build-time rewrite of a .cu file for the cudaemu shim (the source stays unchanged).

Two textual changes, both on the line where they occur so that compiler
messages and cudaemu's own messages keep the .cu line numbers (a ``#line``
directive names the original file):

* ``k<<<grid, block, smem, stream>>>(args)`` ->
  ``::cudaemu::launch(k, __FILE__, __LINE__, grid, block, smem, stream)(args)``;
* ``__shared__ T name[...];`` gets ``::cudaemu::shared_decl(&name, sizeof(name), ...)``
  appended, which poisons the variable at the start of each block.

Usage: python rewrite.py IN.cu OUT.cpp
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
_SHARED = re.compile(r"(__shared__\s+[^;={}()]+?\b(\w+)\s*(?:\[[^\];]*\]\s*)*;)")


def rewrite(text: str, origin: str) -> str:
    """Returns the rewritten source of ``text`` (read from ``origin``)."""
    if re.search(r"extern\s+__shared__", text):
        raise ValueError(f"{origin}: dynamic shared memory (extern __shared__) is not emulated")
    out = _LAUNCH.sub(lambda m: f"::cudaemu::launch({m.group(1)}, __FILE__, __LINE__, {m.group(2)})(", text)
    if "<<<" in out:
        raise ValueError(f"{origin}: a kernel launch was not rewritten")
    out = _SHARED.sub(
        lambda g: f"{g.group(1)} ::cudaemu::shared_decl(&{g.group(2)}, sizeof({g.group(2)}), __FILE__, __LINE__);", out
    )
    return f'#line 1 "{origin}"\n' + out


def rewrite_file(src: Path, dst: Path) -> None:
    """Writes the rewrite of ``src`` to ``dst``, leaving ``dst`` untouched (and
    its mtime, so ninja does not rebuild) when the result is unchanged."""
    text = rewrite(src.read_text(), str(src))
    if not dst.exists() or dst.read_text() != text:
        dst.write_text(text)


def copy_if_changed(src: Path, dst: Path) -> None:
    """Copies ``src`` to ``dst`` unless ``dst`` already has its text (keeping
    its mtime, so ninja does not rebuild)."""
    text = src.read_text()
    if not dst.exists() or dst.read_text() != text:
        dst.write_text(text)


if __name__ == "__main__":
    rewrite_file(Path(sys.argv[1]), Path(sys.argv[2]))
