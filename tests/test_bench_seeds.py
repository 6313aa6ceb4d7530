"""bench/seeds.py: its per-seed statistics, and one tiny sweep end to end
(a source tree's train.py in a child process, then PSNR inside and outside
the test views' masks)."""

from __future__ import annotations

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import fixtures_data as fx
import pytest
from test_transforms_json import write_transforms

ROOT = Path(__file__).resolve().parents[1]
seeds = runpy.run_path(str(ROOT / "bench" / "seeds.py"))


def _row(cell, seed, psnr, inside=None, outside=None):
    return dict(cell=cell, seed=seed, psnr=psnr, psnr_in_mask=inside, psnr_outside_mask=outside)


def test_summary_means_stds_and_paired_differences():
    runs = [
        _row("old", 0, 21.0, 24.0, 19.0),
        _row("old", 1, 20.0, 23.0, 18.0),
        _row("old", 2, 22.0, 24.0, 20.0),
        _row("new", 0, 19.0, 24.0, 16.0),
        _row("new", 1, 19.5, 23.5, 17.0),
        _row("new", 2, 20.0, 23.0, 17.0),
    ]
    s = seeds["summarise"](runs, ["old", "new"])
    assert s["old"]["psnr"] == {"mean": 21.0, "std": 1.0, "n": 3}
    assert "psnr_minus_old" not in s["old"]  # the reference has no difference from itself
    d = s["new"]["psnr_minus_old"]  # per seed: -2, -0.5, -2
    assert d["mean"] == pytest.approx(-1.5) and d["n"] == 3
    sd = math.sqrt(((0.5) ** 2 + 1.0**2 + 0.5**2) / 2)
    assert d["std"] == pytest.approx(sd, abs=1e-6)  # kept to 6 decimals (depth errors are ~1e-3)
    assert d["t"] == pytest.approx(round(-1.5 / (sd / math.sqrt(3)), 2))
    assert s["new"]["psnr_in_mask_minus_old"]["mean"] == pytest.approx(-0.167, abs=1e-3)
    rows = seeds["table"](s, ["old", "new"])
    assert rows[0]["cell"] == "old" and rows[0]["psnr"] == "21.00 ± 1.00" and rows[0]["psnr change"] is None
    assert rows[1]["psnr change"].startswith("-1.50 (t ") and rows[1]["seeds"] == 3
    # a seed the reference lacks is left out of the differences, not paired with another
    s = seeds["summarise"](runs + [_row("new", 3, 30.0)], ["old", "new"])
    assert s["new"]["psnr_minus_old"]["n"] == 3 and s["new"]["psnr"]["n"] == 4
    assert s["new"]["psnr_outside_mask"]["n"] == 3  # seed 3 has no mask figure: not counted as one
    # depth and normal errors (scenes with ground truth): summarised, paired, shown in percent
    for r, (depth, deg) in zip(
        runs, [(0.008, 5.0), (0.009, 5.5), (0.010, 6.0), (0.006, 4.0), (0.007, 4.5), (0.007, 5.0)]
    ):
        r.update(depth_rel_err=depth, normal_deg_err=deg)
    s = seeds["summarise"](runs, ["old", "new"])
    assert s["new"]["depth_rel_err_minus_old"]["mean"] == pytest.approx(-0.0023333, abs=1e-6)
    assert s["new"]["normal_deg_err_minus_old"]["mean"] == pytest.approx(-1.0)
    rows = seeds["table"](s, ["old", "new"])
    assert rows[0]["depth %"] == "0.900 ± 0.100" and rows[0]["normals deg"] == "5.50 ± 0.50"


def test_a_tiny_sweep_trains_each_cell_and_splits_psnr_by_the_masks(tmp_path):
    data = write_transforms(tmp_path / "scene", fx.make_scene(n_views=4, width=16, height=12), masks=True)
    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable, str(ROOT / "bench" / "seeds.py"), "--data", data.name, "--seeds", "0",
        "--variant", "base=", "--variant", "more=train.iterations=4", "--keep", "runs",
        "--out", str(out), "data.test_every=4", "train.iterations=2", "model.init=random",
        "model.init_num_random=50", "checkpoint.every=0", "log.progress=false",
    ]  # fmt: skip
    # relative --data and --keep: each run works in its tree's folder, so they must be resolved first
    subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=tmp_path)
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["cell"], r["seed"]) for r in runs] == [("base", 0), ("more", 0)]
    for r in runs:
        assert r["returncode"] == 0 and "random" in r["init"]
        # the bench's own render agrees with the trainer's figure for the whole image
        assert r["psnr"] == pytest.approx(r["trainer_psnr"], abs=1e-4)
        assert r["psnr_in_mask"] is not None and r["psnr_outside_mask"] is not None
        assert r["psnr_in_mask"] != r["psnr_outside_mask"]
    assert report["summary"]["more"]["psnr_minus_base"]["n"] == 1
    # a second sweep into the same folder evaluates the kept runs instead of training again
    stamp = (tmp_path / "runs" / "base_s0" / "metrics.json").stat().st_mtime_ns
    subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=tmp_path)
    assert (tmp_path / "runs" / "base_s0" / "metrics.json").stat().st_mtime_ns == stamp
    assert json.loads(out.read_text())["runs"] == runs
