"""Training progress: a tqdm bar on a terminal, plain log lines otherwise.

``log.progress`` is ``auto`` (the default: the bar only when stderr is a
terminal), ``true`` or ``false`` (forced); ``train.py --progress`` and
``--no-progress`` force it from the command line.  Under nohup, in CI or in a
pipe the bar's carriage-return updates would fill the log, so a piped run must
print no ``\\r`` at all.
"""

import io
import subprocess
import sys
from pathlib import Path

import pytest

from splat.config import load_config
from splat.errors import ConfigError
from splat.trainer import Trainer, use_progress_bar

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample_scene"
# A few steps of the bundled sample: enough for a bar and two log lines.
QUICK = ["--iterations", "3", "model.sh_degree=0", "checkpoint.every=0"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_setting_accepts_auto_true_and_false(tmp_path):
    assert load_config(None)["log"]["progress"] == "auto"
    for name in ("default", "fast"):
        assert load_config(str(ROOT / "configs" / f"{name}.yaml"))["log"]["progress"] == "auto"
    for text, value in (("auto", "auto"), ("true", True), ("false", False)):
        got = load_config(None, [f"log.progress={text}"])["log"]["progress"]
        assert got == value and type(got) is type(value)
    # A config written before "auto" existed (progress: true / false) still loads.
    old = tmp_path / "old.yaml"
    old.write_text("log:\n  progress: false\n")
    assert load_config(str(old))["log"]["progress"] is False
    for bad in ("1", "0", "maybe", "[true]"):
        with pytest.raises(ConfigError, match="log.progress"):
            load_config(None, [f"log.progress={bad}"])


def test_auto_means_a_bar_only_on_a_terminal():
    assert use_progress_bar("auto", _Terminal()) is True
    assert use_progress_bar("auto", io.StringIO()) is False
    assert use_progress_bar("auto", object()) is False  # no isatty at all
    closed = io.StringIO()
    closed.close()
    assert use_progress_bar("auto", closed) is False
    for stream in (_Terminal(), io.StringIO()):
        assert use_progress_bar(True, stream) is True
        assert use_progress_bar(False, stream) is False


def _train(tmp_path, *args):
    cmd = [sys.executable, str(ROOT / "train.py"), "--data", str(SAMPLE), "--out", str(tmp_path / "out"), *QUICK, *args]
    # Bytes, not text=True: universal newlines would turn every "\r" into "\n".
    res = subprocess.run(cmd, capture_output=True, timeout=300, cwd=ROOT)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err
    return err


def test_piped_run_prints_log_lines_and_no_carriage_returns(tmp_path):
    err = _train(tmp_path)
    assert "\r" not in err
    assert "step 1/3  loss" in err and "step 3/3  loss" in err
    assert "done: 3 steps" in err


def test_forced_progress_draws_the_bar_even_when_piped(tmp_path):
    err = _train(tmp_path, "--progress")
    assert "\r" in err and "3/3" in err
    assert "step 1/3  loss" not in err


def test_auto_draws_the_bar_when_stderr_is_a_terminal(tmp_path, monkeypatch):
    cfg = load_config(None, [f"data.path={SAMPLE}", "train.iterations=2", "model.sh_degree=0", "checkpoint.every=0"])
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    Trainer(cfg, tmp_path / "out").train()
    err = terminal.getvalue()
    assert "\r" in err and "2/2" in err
    assert "step 1/2  loss" not in err
