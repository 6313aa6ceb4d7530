"""train.py / render.py: every user mistake is one line ``error: ...`` naming
the file, key or value, a non-zero exit code and no traceback (``--debug``
keeps the traceback)."""

from __future__ import annotations

import errno
import importlib.util
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import TINY_OVERRIDES, make_tiny_scene  # tests/ is on sys.path under pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_train_cli():
    spec = importlib.util.spec_from_file_location("train_cli", ROOT / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


train_cli = _load_train_cli()


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return make_tiny_scene(tmp_path_factory.mktemp("scene"), n_views=6)


def _train(capsys, *args):
    """(exit code, stderr) of ``train.py args`` run in-process."""
    code = train_cli.main([str(a) for a in args])
    return code, capsys.readouterr().err


def _one_error_line(err: str, *words) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


def _base(scene, out, *extra):
    return ["--data", scene, "--out", out, "--iterations", 2, "--no-progress", *TINY_OVERRIDES, *extra]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["model.sh_degree=5"], ["model.sh_degree", "5"]),
        (["data.downscale=0"], ["data.downscale", ">= 1", "0"]),
        (["render.near=2", "render.far=1"], ["render.near", "render.far"]),
        (["train.iterations=-3"], ["train.iterations", "-3"]),
        (["model.init_opacity=1.5"], ["model.init_opacity", "1.5"]),
        (["data.background=[1,1]"], ["data.background", "3 values"]),
        (["model.colour=3"], ["unknown config key", "model.colour"]),
        (["model.init=random", "model.init_num_random=0"], ["model.init_num_random=0", "no surfels"]),
    ],
)
def test_train_bad_values(capsys, scene, tmp_path, extra, words):
    code, err = _train(capsys, *_base(scene, tmp_path / "out", *extra))
    assert code == 1
    _one_error_line(err, *words)


def test_train_config_file_errors(capsys, scene, tmp_path):
    code, err = _train(capsys, *_base(scene, tmp_path / "o1", "--config", tmp_path / "nope.yaml"))
    assert code == 1
    _one_error_line(err, "nope.yaml", "not found")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {iterations: [\n")
    code, err = _train(capsys, *_base(scene, tmp_path / "o2", "--config", bad))
    assert code == 1
    _one_error_line(err, "bad.yaml", "invalid YAML")
    bad.write_text("train: {iterations: many}\n")
    code, err = _train(capsys, "--data", scene, "--out", tmp_path / "o3", "--config", bad)
    _one_error_line(err, "bad.yaml", "train.iterations", "many")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_train_cuda_without_gpu(capsys, scene, tmp_path):
    code, err = _train(capsys, *_base(scene, tmp_path / "out", "device=cuda"))
    assert code == 1
    _one_error_line(err, "device=cuda", "no CUDA GPU")


def test_train_out_is_a_file_or_unwritable(capsys, scene, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    code, err = _train(capsys, *_base(scene, f))
    assert code == 1
    _one_error_line(err, str(f), "is a file")
    if sys.platform.startswith("linux"):
        code, err = _train(capsys, *_base(scene, "/proc/self/no_such_dir"))  # cannot be created, even by root
        assert code == 1
        _one_error_line(err, "/proc/self/no_such_dir", "not writable")
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            code, err = _train(capsys, *_base(scene, ro))
        finally:
            ro.chmod(0o700)
        assert code == 1
        _one_error_line(err, str(ro), "not writable")


def test_train_missing_data(capsys, tmp_path):
    code, err = _train(capsys, "--data", tmp_path / "nothing", "--out", tmp_path / "out", "--no-progress")
    assert code == 1
    _one_error_line(err, "nothing")


def test_overrides_may_stand_between_flags_and_runs_are_guarded(capsys, scene, tmp_path):
    out = tmp_path / "out"
    args = [
        "--data",
        scene,
        "train.iterations=2",
        "--out",
        out,
        *TINY_OVERRIDES[:3],
        "--no-progress",
        *TINY_OVERRIDES[3:],
        "checkpoint.every=1",
    ]
    code, err = _train(capsys, *args)
    assert code == 0, err
    assert "done: 2 steps" in err
    code, err = _train(capsys, *args, "loss.dist_lambda=3")
    assert code == 1
    _one_error_line(err, str(out), "another run", "loss.dist_lambda", "--overwrite")
    code, err = _train(capsys, *args, "loss.dist_lambda=3", "--resume")
    assert code == 1
    _one_error_line(err, "another run", "loss.dist_lambda")
    code, err = _train(capsys, *args, "loss.dist_lambda=3", "--overwrite")
    assert code == 0, err
    with pytest.raises(SystemExit) as e:  # argparse: not allowed together
        _train(capsys, *args, "--resume", "--overwrite")
    assert e.value.code == 2


def test_debug_keeps_the_traceback(capsys, scene, tmp_path):
    from splat.errors import ConfigError

    with pytest.raises(ConfigError):
        train_cli.main([str(a) for a in _base(scene, tmp_path / "out", "model.sh_degree=5", "--debug")])


def _render(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "render.py"), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_render_errors(tmp_path, scene):
    res = _render("--model", tmp_path / "nothing", "--no-progress")
    assert res.returncode == 1
    _one_error_line(res.stderr, "config.yaml", "not found")
    # a run folder whose only checkpoint has no parameters
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *map(str, _base(scene, out, "--iterations", 1))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    (out / "point_cloud.ply").unlink()
    ckpt = next((out / "checkpoints").glob("ckpt_*.pt"))
    torch.save({"step": 1}, ckpt)
    res = _render("--model", out, "--no-progress", "render.depth=median")
    assert res.returncode == 1
    _one_error_line(res.stderr, str(out), "checkpoint")
    assert "has no model parameters" in res.stderr  # the warning says why it was skipped
    res = _render("--model", out, "--no-progress", "render.near=-1")
    _one_error_line(res.stderr, "render.near", "-1")


# ------------------------------------------------------------ interrupts
#: Runs the script argv[1] as ``python script args...`` would, but holds the
#: first ``import torch`` (seconds of a real start-up) and says so on stdout,
#: so that the test interrupts exactly then.  SIGINT is set to Python's
#: default as a terminal would have it: a test runner started as a background
#: job of a non-interactive shell passes SIGINT on ignored.
_HOLD_TORCH_IMPORT = """
import importlib.abc, runpy, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("importing torch", flush=True)
            time.sleep(120)
sys.meta_path.insert(0, Hold())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _signal_after_line(cmd, line: str, sig, **popen) -> tuple:
    """(exit code, stderr) of ``cmd``, sent ``sig`` once it has printed ``line`` on stdout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        assert proc.stdout.readline() == line
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]  # a safety net: it ends at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize(
    "script, args",
    [
        ("view.py", ["--model", "m"]),
        ("convert.py", ["--images", "i", "--out", "o"]),
        ("train.py", ["--data", "d", "--out", "o"]),
        ("render.py", ["--model", "m"]),
    ],
)
def test_ctrl_c_during_start_up_is_one_line(script, args, tmp_path):
    code, err = _signal_after_line(
        [sys.executable, "-c", _HOLD_TORCH_IMPORT, str(ROOT / script), *args],
        "importing torch\n",
        signal.SIGINT,
        cwd=tmp_path,
    )
    assert (code, err) == (130, "error: interrupted\n"), err


def _native_dump(err: str) -> bool:
    """Whether ``err`` holds glog's failure-signal report (pycolmap installs it on import)."""
    return "SIGTERM received" in err or "*** Aborted at" in err


def test_sigterm_after_importing_pycolmap_is_one_line():
    """The handler comes back after pycolmap's import replaced it (import after the handler is set)."""
    pytest.importorskip("pycolmap")
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from splat.sfm.sigterm import sigterm_as_interrupt\n"
        "def work():\n"
        "    import pycolmap  # installs glog's failure-signal handler, SIGTERM included\n"
        "    print('imported', flush=True)\n"
        "    time.sleep(120)\n"
        "sys.exit(sigterm_as_interrupt(work)())\n"
    )
    code, err = _signal_after_line([sys.executable, "-c", code], "imported\n", signal.SIGTERM)
    assert not _native_dump(err), err
    assert (code, err) == (143, "error: terminated (SIGTERM)\n"), err


def test_train_sigterm_is_one_line_and_keeps_checkpoints(scene, tmp_path):
    """SIGTERM to train.py (with pycolmap imported, as when it triangulates) ends
    it like Ctrl+C: one line, exit code 143, the checkpoints kept for --resume."""
    pytest.importorskip("pycolmap")
    from splat.run_folder import list_checkpoints

    out = tmp_path / "out"
    code = (
        "import runpy, sys\n"
        "import pycolmap  # installs glog's failure-signal handler, SIGTERM included\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    args = [str(a) for a in _base(scene, out, "--iterations", 100000, "checkpoint.every=5")]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT / "train.py"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # a safety net: the first checkpoint takes seconds
        while not list_checkpoints(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _native_dump(err) and "Traceback" not in err, err
    assert proc.returncode == 143, err
    assert err.splitlines()[-1] == "error: terminated (SIGTERM)", err
    assert list_checkpoints(out)


def test_an_error_raised_while_handling_an_interrupt_is_the_interrupt(capsys):
    """A clean-up that fails on what Ctrl+C or SIGTERM left (torch.save's zip
    writer: "unexpected pos") must still end in the interrupt's one line and
    exit code, not in its own traceback (CI caught SIGTERM landing mid-checkpoint)."""
    from splat.errors import run_cli
    from splat.sfm.sigterm import EXIT_CODE, Terminated, sigterm_as_interrupt

    def failing_cleanup(interrupt):
        def fn():
            try:
                raise interrupt
            finally:
                raise RuntimeError("unexpected pos 100096 vs 99984")

        return fn

    assert run_cli(failing_cleanup(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    assert run_cli(sigterm_as_interrupt(failing_cleanup(Terminated()))) == EXIT_CODE
    assert capsys.readouterr().err == "error: terminated (SIGTERM)\n"
    with pytest.raises(RuntimeError):  # debug: the traceback
        run_cli(sigterm_as_interrupt(failing_cleanup(Terminated()), debug=True), debug=True)
    with pytest.raises(RuntimeError):  # no interrupt behind it: a bug stays a traceback
        run_cli(lambda: (_ for _ in ()).throw(RuntimeError("a bug")))


class _FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, f, room: int = 1000):
        self.f, self.room = f, room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)


def test_disk_full_while_writing_a_checkpoint_is_one_line(capsys, scene, tmp_path, monkeypatch):
    """ENOSPC inside torch.save: its zip writer then fails again on the short
    file ("unexpected pos"), which printed a chained traceback; one line
    names the folder and the space instead."""
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, _FullDisk(f), *a, **k))
    out = tmp_path / "out"
    code, err = _train(capsys, *_base(scene, out))
    assert code == 1
    line = _one_error_line(err, out / "checkpoints", "no space left", "MiB free", "--resume")
    assert "unexpected pos" not in err and "Errno" not in line
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp file left
