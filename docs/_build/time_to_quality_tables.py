"""The "CPU time to quality" page's tables, generated from a
``bench/time_to_quality.py`` results file (``docs/time_to_quality.md``
holds the marker ``<!-- generated: time-to-quality NAME.json -->``).

    python docs/_build/time_to_quality_tables.py time_to_quality.json   # prints the Markdown
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks import RESULTS, escape, fmt, git_stored, machine_text  # noqa: E402


def _seconds(v) -> str:
    """Seconds as the table shows them: whole seconds, '—' for never reached."""
    return "—" if v is None else f"{v:.0f}"


def markdown(name: str, results: Path = RESULTS) -> str:
    """One table per scene: a row per (config, primitive), the seconds to each PSNR level."""
    path = results / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file")
    data = json.loads(path.read_text())
    near = data["near_final_db"]
    out = [
        f"- **Machine:** {machine_text(data['machine'])}",
        f"- **Measured at:** `{data['commit']}` on {data['date']}; stored {git_stored(path)} (`bench/results/{name}`)",
        f"- **Command:** `{data['command']}`",
        f"- **OpenSplat:** {escape(data['opensplat'])}",
        "",
    ]
    for scene, levels in data["levels"].items():
        cells = [c for c in data["cells"] if c["scene"] == scene]
        if not cells:
            continue
        head = ["config", "primitive", "primitives", "PSNR (dB)", "depth (%)", "normals (°)", "training (s)"]
        head += [f"to {lv:g} dB (s)" for lv in levels] + [f"to final − {near:g} dB (s)"]
        out += [f"### {scene}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in cells:
            if "error" in c:
                row = [c["config"], c["primitive"], escape(c["error"])] + [""] * (len(head) - 3)
            else:
                row = [c["config"], c["primitive"], fmt(c["primitives"]), fmt(c["psnr"]), fmt(c["depth_pct"]),
                       fmt(c["normal_deg"]), _seconds(c["train_s"])]
                row += [_seconds(c.get(f"s_to_{lv:g}dB")) for lv in levels]
                row += [_seconds(c.get(f"s_to_final-{near:g}dB"))]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out.append("Each cell's command: " + "; ".join(
            f"`{cmd}`" for tag, cmd in data["commands"].items() if tag.startswith(scene + "_")) + ".")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(sys.argv[1]))
