"""bench/time_to_quality.py's summaries and the docs tables made from them (issue 43)."""

from __future__ import annotations

import builtins
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ttq = runpy.run_path(str(ROOT / "bench" / "time_to_quality.py"))

CURVE = [  # step, seconds, PSNR, depth error, normal error
    [100, 10.0, 24.0, 0.05, 20.0],
    [200, 21.0, 31.0, 0.02, 9.0],
    [300, 33.0, 30.5, 0.02, 8.0],
    [400, 44.0, 34.2, 0.01, 6.0],
]


def _run(curve=CURVE, psnr=34.2):
    metrics = {"test.psnr": psnr, "test.depth_rel_err": 0.0123, "test.normal_deg_err": 6.04, "n_gaussians": 5000}
    return {"metrics": metrics, "curve": curve}


def test_seconds_to_is_the_first_row_at_or_above_the_level():
    assert ttq["seconds_to"](CURVE, 30.0) == 21.0  # not 33.0: a later dip does not move it
    assert ttq["seconds_to"](CURVE, 34.2) == 44.0  # "at or above"
    assert ttq["seconds_to"](CURVE, 35.0) is None
    assert ttq["seconds_to"]([[100, 5.0, None, None, None]], 1.0) is None  # no PSNR measured: not reached


def test_summary_row():
    row = ttq["summarise"](_run(), [30.0, 34.0, 36.0])
    assert row["psnr"] == 34.2 and row["depth_pct"] == 1.23 and row["normal_deg"] == 6.04
    assert row["primitives"] == 5000 and row["train_s"] == 44.0  # the last row's seconds
    assert (row["s_to_30dB"], row["s_to_34dB"], row["s_to_36dB"]) == (21.0, 44.0, None)
    assert row["s_to_final-0.5dB"] == 44.0  # 33.7 dB: 31.0 and 30.5 are below it
    assert ttq["summarise"]({"error": "exit code 1, no x.json"}, [30.0]) == {"error": "exit code 1, no x.json"}


def test_unknown_shared_folder_is_one_line(tmp_path, capsys):
    assert ttq["main"](["--shared", str(tmp_path), "--scenes", "fox"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shared" in err[0] and "scenes/fox" in err[0]


def test_docs_tables_from_a_results_file(tmp_path):
    sys.path.insert(0, str(ROOT / "docs" / "_build"))
    import time_to_quality_tables

    row = dict(scene="still_life", config="fast", primitive="2dgs", **ttq["summarise"](_run(), [30.0, 36.0]))
    failed = dict(scene="still_life", config="default", primitive="3dgs", error="exit code 1")
    data = dict(
        machine={"cpus": 2, "threads": 2}, commit="abc1234", date="2026-11-29", command="python bench/x.py",
        commands={"still_life_fast_2dgs": "python bench/quality.py X"}, levels={"still_life": [30.0, 36.0]},
        near_final_db=0.5, opensplat="does not build here", cells=[row, failed],
    )  # fmt: skip
    (tmp_path / "ttq.json").write_text(json.dumps(data))
    page = time_to_quality_tables.markdown("ttq.json", tmp_path)
    lines = page.splitlines()
    assert "### still_life" in lines
    header = next(ln for ln in lines if ln.startswith("| config"))
    assert "to 30 dB (s)" in header and "to 36 dB (s)" in header and "to final − 0.5 dB (s)" in header
    assert "| fast | 2dgs | 5000 | 34.2 | 1.23 | 6.04 | 44 | 21 | — | 44 |" in lines
    assert any(ln.startswith("| default | 3dgs | exit code 1 |") for ln in lines)
    assert "`python bench/quality.py X`" in page and "does not build here" in page


def test_warm_file_cache_reads_every_file(tmp_path, monkeypatch):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"x" * 100)
    (tmp_path / "transforms.json").write_text("{}")
    opened = []
    real_open = builtins.open

    def spy(path, *a, **k):
        opened.append(Path(path).name)
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    seconds = ttq["warm_file_cache"](tmp_path)
    monkeypatch.undo()
    assert sorted(opened) == ["a.png", "transforms.json"] and seconds >= 0
