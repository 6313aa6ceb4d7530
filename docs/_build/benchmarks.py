"""The benchmark tables of the docs, generated from ``bench/results/*.json``.

Run at every docs build (``docs/_build/hooks.py``), so the figures on the
page are the ones in the files, with the machine, commit and command each
file records, and the date and commit that stored it (from git).  A file of
a new shape needs no code here: every file gets a generic section (its
top-level records as tables).  Two summaries gather the old-against-new runs
of ``bench/rasterize_compare.py`` and ``bench/train_step.py`` into one table
each.

    python docs/_build/benchmarks.py          # prints the Markdown
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"

#: Top-level keys shown as the file's provenance, not as data.
PROVENANCE = ("what", "scene", "machine", "commit", "commits", "command", "commands", "command_new",
              "command_old", "config", "note")

#: Sections of the page: (title, file-name prefixes), in this order; the rest go under "Other".
GROUPS = (
    ("Rasterizer", ("cpu", "rasterize")),
    ("Training step", ("train_step",)),
    ("Training quality", ("training",)),
    ("CPU time to quality", ("time_to_quality",)),
    ("Scenes without SfM points", ("init_without_points",)),
    ("Meshes", ("dtu_scan24_mesh",)),
    ("Robustness and the CUDA test harness", ("kill_resume", "cuda_emulation")),
    ("Viewer", ("viewer",)),
    ("Several processes", ("distributed",)),
    ("Sharing on the web", ("sharing",)),
)


# ------------------------------------------------------------- formatting
def fmt(v) -> str:
    """A JSON value as a table cell: floats to 4 significant digits
    (whole numbers from 1000 up), text escaped for Markdown tables."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, (list, dict)):
        return f"({len(v)} entries)"
    return escape(str(v))


def escape(text: str) -> str:
    for ch in ("\\", "|", "*", "_", "<", "[", "]"):
        text = text.replace(ch, "\\" + ch)
    return text.replace("\n", " ")


def flatten(record: dict, prefix: str = "") -> dict:
    """Nested dicts -> one level with dotted keys; lists stay values."""
    out = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def table(rows: list, label: str = "") -> str:
    """Markdown table of ``rows`` [(row label, record dict)]; columns are the
    union of the records' flattened keys, in first-seen order."""
    flat = [(name, flatten(rec)) for name, rec in rows]
    cols = []
    for _, rec in flat:
        cols += [k for k in rec if k not in cols]
    head = ([label] if label is not None else []) + cols
    lines = ["| " + " | ".join(escape(h) for h in head) + " |",
             "|" + "---|" * len(head)]
    for name, rec in flat:
        cells = ([escape(str(name))] if label is not None else []) + [fmt(rec.get(c)) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def is_records(v) -> bool:
    if isinstance(v, dict):
        return bool(v) and all(isinstance(x, dict) for x in v.values())
    if isinstance(v, list):
        return bool(v) and all(isinstance(x, dict) for x in v)
    return False


def records(v) -> list:
    return list(v.items()) if isinstance(v, dict) else [(i, x) for i, x in enumerate(v)]


# ------------------------------------------------------------- provenance
def git_stored(path: Path) -> str:
    """'2026-11-23 in c84c96d': the last commit that changed ``path``, or a
    note that git could not say (a copy outside a git checkout)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ad %h", "--date=short", "--", str(path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if not out:
        return "not known (no git history here)"
    date, commit = out.split()
    return f"{date} in `{commit}`"


def machine_text(m) -> str:
    if isinstance(m, dict):
        parts = []
        if m.get("cpus") is not None:
            parts.append(f"{m['cpus']} CPUs")
        if m.get("platform"):
            parts.append(str(m["platform"]))
        if m.get("torch"):
            parts.append(f"torch {m['torch']}")
        parts.append(f"GPU {m['gpu']}" if m.get("gpu") else "no GPU")
        if m.get("threads") is not None:
            parts.append(f"{m['threads']} threads")
        if m.get("load_average"):
            parts.append("load average " + ", ".join(f"{x:.2f}" for x in m["load_average"]))
        if m.get("note"):
            parts.append(str(m["note"]))
        return escape("; ".join(parts))
    return escape(str(m))


def provenance(path: Path, data: dict) -> list:
    lines = [f"- **Stored:** {git_stored(path)}"]
    if "commit" in data:
        lines.append(f"- **Measured at:** {escape(str(data['commit']))}")
    if "commits" in data:
        c = data["commits"]
        text = ", ".join(f"`{v}` ({escape(str(k))})" for k, v in c.items()) if isinstance(c, dict) else fmt(c)
        lines.append(f"- **Commits compared:** {text}")
    if "machine" in data:
        lines.append(f"- **Machine:** {machine_text(data['machine'])}")
    for key in ("what", "scene", "config", "note"):
        if key in data:
            lines.append(f"- **{key.capitalize()}:** {fmt(data[key])}")
    for key in ("command", "commands", "command_new", "command_old"):
        if key in data:
            v = data[key]
            items = v.items() if isinstance(v, dict) else [(None, v)]
            for name, cmd in items:
                label = key.replace("_", " ") + (f" ({name})" if name else "")
                lines.append(f"- **{label.capitalize()}:** `{cmd}`")
    return lines


# ------------------------------------------------------------- one file
def file_section(path: Path, level: int = 3) -> str:
    """Markdown for one results file: a heading, its provenance, its data as tables."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file")
    data = json.loads(path.read_text())
    out = ["#" * level + f" `{path.name}`", ""]
    if not isinstance(data, dict):
        data = {"values": data}
    out += provenance(path, data)
    scalars = [(k, v) for k, v in data.items() if k not in PROVENANCE and not isinstance(v, dict)
               and not is_records(v)]
    for k, v in scalars:
        out.append(f"- {escape(k)}: {fmt(v)}")
    out.append("")
    for k, v in data.items():
        if k in PROVENANCE or (k, v) in scalars:
            continue
        out.append(f"**{escape(k)}**")
        out.append("")
        if is_records(v):
            out.append(table(records(v), label=""))
        else:  # a dict of values (and perhaps nested dicts): one row
            out.append(table([("", v)], label=None))
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------- summaries
OLD_COMMIT = "c95de2c"  # the tree before the CPU speed work, the baseline of every comparison


def _comparison(path: Path, key: str):
    """(data, commits, old root, new root, {(case, root): record}) of an old-against-new file."""
    d = json.loads(path.read_text())
    commits = d["commits"]
    old_root = next(r for r, c in commits.items() if c == OLD_COMMIT)
    new_root = next(r for r in commits if r != old_root)
    return d, commits, old_root, new_root, {(r[key], r["root"]): r for r in d["results"]}


def compare_summary(files) -> str:
    """bench/rasterize_compare.py runs: one row per file and case."""
    lines = ["| file | stored | new commit | case | old (c95de2c) ms | new ms | old / new | peak RSS new / old |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for path in files:
        d, commits, old_root, new_root, rows = _comparison(path, "case")
        for case, ratio in d["ratios"].items():
            lines.append(f"| `{path.name}` | {git_stored(path)} | `{commits[new_root]}` | {escape(case)} | "
                         f"{fmt(rows[case, old_root]['total_ms'])} | {fmt(rows[case, new_root]['total_ms'])} | "
                         f"**{fmt(ratio['speedup_total'])}×** | {fmt(ratio['memory_ratio'])} |")
    return "\n".join(lines)


def train_step_summary(files) -> str:
    """bench/train_step.py runs: one row per file, scene and surfel count."""
    lines = ["| file | stored | new commit | scene | surfels | old (c95de2c) ms | new ms | old / new |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for path in files:
        d, commits, old_root, new_root, rows = _comparison(path, "scene")
        for scene, ratio in d["speedup_old_over_new"].items():
            old, new = rows[scene, old_root], rows[scene, new_root]
            lines.append(f"| `{path.name}` | {git_stored(path)} | `{commits[new_root]}` | {escape(scene)} | "
                         f"{new['surfels']} | {fmt(old['ms_per_step']['total'])} | "
                         f"{fmt(new['ms_per_step']['total'])} | **{fmt(ratio['total'])}×** |")
    return "\n".join(lines)


# ------------------------------------------------------------- the page
def markdown(results: Path = RESULTS) -> str:
    files = sorted(results.glob("*.json"))
    out = []
    compare = [f for f in files if f.name.startswith("rasterize_compare")]
    steps = [f for f in files if f.name.startswith("train_step")]
    if compare:
        out += ["## Summary: CPU rasterizer, old against new", "",
                "`splat.rasterize` forward + backward of every output, the tree at `c95de2c` (before the "
                "CPU speed work) against the commit named, alternating in one run "
                "(`bench/rasterize_compare.py`).  Only ratios from one file mean anything: the machine's "
                "speed drifts between runs.", "", compare_summary(compare), ""]
    if steps:
        out += ["## Summary: CPU training step, old against new", "",
                "One training step at 800×600 (default config at step 701: distortion and normal losses on), "
                "`c95de2c` against the commit named (`bench/train_step.py`).", "",
                train_step_summary(steps), ""]
    seen = set()
    for title, prefixes in GROUPS + (("Other results", None),):
        group = [f for f in files if f not in seen and (prefixes is None or f.name.startswith(prefixes))]
        if not group:
            continue
        seen.update(group)
        out += [f"## {title}", ""]
        for path in group:
            out += [file_section(path), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
