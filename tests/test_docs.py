"""The documentation cannot rot: its code runs, its generated pages cover the
code and the results, and the README's commands are the ones CI runs.

* every ```python block of ``docs/*.md`` runs, in order, one namespace per
  page, from the repository root (so the examples must stay small and fast);
* the README stays short, and links only to files inside the repository;
* ``.ci/run`` runs the README's "Install" and "Test" commands, and builds the
  docs with warnings as errors;
* the generated config reference names every field of ``splat/config.py``,
  and the generated benchmark page every file in ``bench/results/``.

The site itself is built by ``.ci/run`` (``mkdocs build --strict``), not here.
"""

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"

sys.path.insert(0, str(DOCS / "_build"))

FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
PAGES = sorted(p.name for p in DOCS.glob("*.md") if FENCE.search(p.read_text()))


def _bash_blocks(markdown: str, heading: str) -> list:
    """The command lines of the ```bash blocks under ``## heading`` (comments dropped)."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert m, f"README has no '## {heading}' section"
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", m.group(1), re.M | re.S):
        lines += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return lines


def _normalise(command: str) -> str:
    """``python -m pip install -q X`` and ``pip install X`` are one command."""
    command = re.sub(r"^python -m ", "", command.strip())
    return re.sub(r"\s+", " ", command.replace(" -q ", " "))


# ------------------------------------------------------------------ examples
def test_some_pages_have_examples():
    assert {"install.md", "quickstart.md", "maths.md", "conventions.md"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_python_examples_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": f"docs_{page[:-3]}"}
    for i, block in enumerate(FENCE.findall((DOCS / page).read_text())):
        exec(compile(block, f"docs/{page} (python block {i + 1})", "exec"), namespace)


# -------------------------------------------------------------------- README
def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines; move detail into docs/"


def test_readme_points_only_inside_the_repository():
    text = README.read_text()
    assert "../" not in text and "/work/" not in text and "shared/scenes" not in text
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets, "README links to its docs"
    for target in targets:
        assert not re.match(r"[a-z]+:", target), f"README links outside the repository: {target}"
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"README links to a missing file: {target}"


def test_docs_links_to_pages_resolve_and_every_page_is_in_the_nav():
    """What ``mkdocs build --strict`` refuses, caught by the suite too: a link
    to a page that does not exist, and a page the site's navigation leaves out."""
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages - nav == set(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"mkdocs.yml's nav names missing pages: {sorted(nav - pages)}"
    for page in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([^)\s#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).is_file(), f"docs/{page.name} links to a missing page: {target}"


def test_ci_runs_the_readme_install_and_test_commands():
    readme, ci = README.read_text(), CI.read_text()
    ci_lines = {_normalise(line) for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")}
    for heading in ("Install", "Test"):
        commands = _bash_blocks(readme, heading)
        assert commands, f"README '## {heading}' shows no command"
        for command in commands:
            assert _normalise(command) in ci_lines, f".ci/run does not run the README's {heading} command {command!r}"


def test_ci_builds_the_docs_with_warnings_as_errors():
    ci = CI.read_text()
    assert "pip install -q -r docs/requirements.txt" in ci
    assert re.search(r"mkdocs build --strict", ci)
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config.get("strict") is True


def test_docs_extra_is_the_docs_requirements():
    # setup.py's "docs" extra reads docs/requirements.txt, so CI (which installs
    # the file, not the extra, to avoid rebuilding the kernels) gets the same list.
    setup = (ROOT / "setup.py").read_text()
    assert '"docs": _requirements(os.path.join("docs", "requirements.txt"))' in setup
    reqs = [
        line
        for line in (DOCS / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert any(r.startswith("mkdocs") for r in reqs) and any(r.startswith("mkdocstrings") for r in reqs)


# ------------------------------------------------------------ the site's pages
def test_nav_lists_every_page_and_every_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def entries(nav):
        for item in nav:
            for value in item.values():
                if isinstance(value, list):
                    yield from entries(value)
                else:
                    yield value

    listed = set(entries(config["nav"]))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert listed == pages, f"only in nav: {listed - pages}; not in nav: {pages - listed}"


def test_every_generated_marker_expands():
    import hooks

    for page in DOCS.glob("*.md"):
        text = page.read_text()
        expanded = hooks.expand(text)
        assert "<!-- generated:" not in expanded, page.name


def test_config_reference_names_every_field():
    import config_reference

    page = config_reference.markdown()
    keys = [key for key, _, _ in config_reference.fields()]
    assert len(keys) > 50 and "log.progress" in keys
    for key in keys:
        assert f"`{key}`" in page, key


def test_benchmark_page_names_every_results_file():
    import benchmarks

    page = benchmarks.markdown()
    for path in (ROOT / "bench" / "results").glob("*.json"):
        assert f"`{path.name}`" in page, path.name
