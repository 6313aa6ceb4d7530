"""MkDocs hooks (``hooks:`` in mkdocs.yml): generated parts of the pages.

A page holds a marker line such as ``<!-- generated: config-reference -->``
or ``<!-- generated: results-file cpu.json -->`` (a generator and its
argument); at build time the marker is replaced by the Markdown the matching
generator returns.  An unknown marker stops the build.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchmarks  # noqa: E402
import config_reference  # noqa: E402
import time_to_quality_tables  # noqa: E402

GENERATORS = {
    "config-reference": config_reference.markdown,
    "benchmarks": benchmarks.markdown,
    # bench/time_to_quality.py's tables, one per scene (bench/results/<name>).
    "time-to-quality": time_to_quality_tables.markdown,
    # One results file: its provenance and tables (bench/results/<name>).
    "results-file": lambda name: benchmarks.file_section(benchmarks.RESULTS / name, level=3),
}
MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([\w.-]+))? -->$", re.M)


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by its generated text."""
    def replace(m):
        name, arg = m.group(1), m.group(2)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name](arg) if arg else GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):
    return expand(markdown)
