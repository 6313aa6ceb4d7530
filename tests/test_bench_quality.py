"""bench/quality.py's comparison with the stored runs (issue 26's guard)."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
quality = runpy.run_path(str(ROOT / "bench" / "quality.py"))


def _run(config, init, psnr, depth, **extra):
    return dict(scene="s", config=config, init=init, metrics={"test.psnr": psnr, "test.depth_rel_err": depth}, **extra)


def test_flags_drops_and_ignores_ablations():
    baseline = {
        "runs": [
            _run("fast", "auto", 37.0, 0.009),
            _run("fast", "auto", 30.0, 0.05, ablation=True),
            _run("default", "auto", 39.0, 0.005),
        ]
    }
    runs = [_run("fast", "auto", 36.4, 0.009), _run("default", "auto", 39.0, 0.0155)]
    flags = quality["compare"](runs, baseline)
    assert len(flags) == 2, flags  # the ablation (listed last) does not replace the real fast run
    assert "0.60 dB below the baseline's 37.00" in flags[0] and "depth error 1.55 %" in flags[1]
    assert quality["compare"]([_run("fast", "auto", 36.6, 0.018)], baseline) == []
    # a run at another resolution is not the same run
    assert quality["compare"]([_run("fast", "auto", 20.0, 0.5, overrides=["data.downscale=4"])], baseline) == []


def test_newest_baseline_is_by_date_then_name_not_file_time(tmp_path):
    for name, date in (
        ("quality_b.json", "2026-11-24"),
        ("quality_a.json", "2026-11-25"),
        ("quality_c.json", "2026-11-25"),
        ("quality_new.json", "2026-11-26"),
    ):
        (tmp_path / name).write_text(json.dumps({"date": date, "runs": []}))
    os.utime(tmp_path / "quality_b.json", (2e9, 2e9))  # the newest file time, the oldest date
    newest = quality["_newest_baseline"]
    assert newest(tmp_path / "quality_new.json", tmp_path).name == "quality_c.json"
    assert newest(tmp_path / "none.json", tmp_path).name == "quality_new.json"


def test_time_to_reach_needs_every_target_at_once():
    curve = [
        [250, 20.0, 30.0, 0.02, 9.0],
        [500, 40.0, 34.0, 0.009, 5.0],
        [750, 60.0, 33.5, 0.008, 4.8],
        [1000, 80.0, 35.0, 0.007, 4.0],
    ]
    reach = quality["time_to_reach"]
    assert reach(curve, 33.7) == 40.0
    # 750's errors are good enough but its PSNR is not: the first row with all three is 1000
    assert reach(curve, 33.7, 0.0081, 4.86) == 80.0
    assert reach(curve, 36.0) is None
    assert reach([[250, 20.0, 35.0, None, None]], 33.7, 0.01) is None  # no depth measured: not reached
