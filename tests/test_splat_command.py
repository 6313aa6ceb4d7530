"""The ``splat`` command (splat/cli.py): ``splat train|render|view|convert``
has exactly the flags of the checkout's scripts, ``python -m splat`` is the
same command, and the configs ship inside the package, so ``--config fast``
works from any folder."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_cli_errors import _one_error_line  # tests/ is on sys.path under pytest
from test_train import TINY_OVERRIDES, make_tiny_scene

import splat
from splat import cli
from splat.config import CONFIG_DIR, config_file, load_config, packaged_configs
from splat.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "render", "view", "convert")


def _env() -> dict:
    """This checkout first on the path: ``python -m splat`` from another folder runs this code."""
    env = dict(os.environ, COLUMNS="100", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _same_help(text: str, prog: str) -> str:
    """Help text with the usage line's program name as the script's and the
    whitespace folded (a longer name re-wraps the usage line, nothing else)."""
    return re.sub(r"\s+", " ", text.replace(f"usage: splat {prog}", f"usage: {prog}.py", 1)).strip()


def _help(capsys, fn, *args) -> str:
    with pytest.raises(SystemExit) as e:
        fn(*args)
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_is_the_scripts_help(capsys, monkeypatch, name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])  # as `python NAME.py --help` names itself
    from_script = _help(capsys, script.main, ["--help"])
    from_command = _help(capsys, cli.main, [name, "--help"])
    assert from_command.startswith(f"usage: splat {name} ")
    assert _same_help(from_command, name) == _same_help(from_script, name)
    assert "--debug" in from_command


def test_python_m_splat_train_help_is_train_py_help(tmp_path):
    """The real processes: ``python train.py --help`` in the checkout and
    ``python -m splat train --help`` from another folder."""
    run = dict(capture_output=True, text=True, timeout=120, env=_env())
    script = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], cwd=ROOT, **run)
    command = subprocess.run([sys.executable, "-m", "splat", "train", "--help"], cwd=tmp_path, **run)
    assert script.returncode == 0 and command.returncode == 0, script.stderr + command.stderr
    assert _same_help(command.stdout, "train") == _same_help(script.stdout, "train")
    for flag in ("--data", "--out", "--config", "--iterations", "--resume", "--overwrite", "--viewer-port"):
        assert flag in command.stdout


def test_top_level_help_and_version(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert re.search(rf"^  {name} ", out, re.M), out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"splat {splat.__version__}"
    assert cli.main([]) == 2  # no command: the help, on stderr
    assert "commands:" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["trian", "fit", "--bogus"])
def test_unknown_command_is_one_line(capsys, word):
    assert cli.main([word, "--out", "x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_error_line(captured.err, repr(word), "train, render, view, convert")
    assert captured.err == line + "\n"


def test_config_names_resolve_to_the_packaged_files(tmp_path, monkeypatch):
    assert packaged_configs() == ["default", "fast"]
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert config_file("fast") == str(CONFIG_DIR / "fast.yaml")
    assert config_file("fast.yaml") == str(CONFIG_DIR / "fast.yaml")
    assert load_config("default") == load_config(str(ROOT / "configs" / "default.yaml"))
    (tmp_path / "fast").write_text("train:\n  iterations: 7\n")  # a file of that name here wins
    assert config_file("fast") == "fast" and load_config("fast")["train"]["iterations"] == 7
    assert config_file("sub/fast.yaml") == "sub/fast.yaml"  # a path: read as given (and missing: named there)
    with pytest.raises(ConfigError, match="sub/fast.yaml: config file not found"):
        load_config("sub/fast.yaml")
    with pytest.raises(ConfigError) as e:
        config_file("fsat")
    assert "'fsat'" in str(e.value) and "(packaged: default, fast)" in str(e.value)


def test_checkout_configs_are_links_to_the_packaged_ones():
    """One copy of each config: configs/NAME.yaml in a checkout is a relative
    link to splat/configs/NAME.yaml, which setup.py ships as package data."""
    assert sorted(p.name for p in (ROOT / "configs").iterdir()) == sorted(p.name for p in CONFIG_DIR.iterdir())
    for path in (ROOT / "configs").iterdir():
        assert path.is_symlink() and os.readlink(path) == f"../splat/configs/{path.name}", path
        assert path.resolve() == (CONFIG_DIR / path.name).resolve()
    setup = (ROOT / "setup.py").read_text()
    assert '"configs/*.yaml"' in setup and '"splat = splat.cli:main"' in setup


def test_unknown_config_name_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--config", "fsat", "--out", str(tmp_path / "out"), "--iterations", "1"])
    assert code == 1
    _one_error_line(capsys.readouterr().err, "'fsat'", "packaged: default, fast")
    assert not (tmp_path / "out").exists()


def test_python_m_splat_trains_with_a_packaged_config_from_another_folder(tmp_path):
    """``python -m splat train --config fast`` from a folder with no configs/:
    2 steps on the tiny scene, and the run's config.yaml is the packaged
    fast.yaml with the same overrides."""
    scene = make_tiny_scene(tmp_path / "scene", n_views=6)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    over = ["--iterations", "2", "--no-progress", *TINY_OVERRIDES, "checkpoint.every=0"]
    res = subprocess.run(
        [sys.executable, "-m", "splat", "train", "--config", "fast", "--data", str(scene), "--out", "run", *over],
        cwd=elsewhere,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    saved = yaml.safe_load((elsewhere / "run" / "config.yaml").read_text())
    expected = load_config(
        str(CONFIG_DIR / "fast.yaml"),
        [f"data.path={scene}", "train.iterations=2", "log.progress=false", *TINY_OVERRIDES, "checkpoint.every=0"],
    )
    assert saved == expected
    assert (elsewhere / "run" / "point_cloud.ply").is_file()
