"""render.py --mesh / --unbounded never reports a mesh it did not write:
an empty result, a failed or interrupted write and a resolution the memory
cannot hold are one line each, and an older mesh.ply stays as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train import make_tiny_scene, tiny_config  # tests/ is on sys.path under pytest

from splat.trainer import Trainer

pytest.importorskip("open3d")
ROOT = Path(__file__).resolve().parents[1]
OLD_MESH = b"ply\nformat ascii 1.0\ncomment an older mesh\nend_header\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    scene = make_tiny_scene(tmp_path_factory.mktemp("scene"))
    out = tmp_path_factory.mktemp("run")
    Trainer(tiny_config(scene, 20), out).train()
    return out


@pytest.fixture
def model(run_dir, tmp_path) -> Path:
    """A copy of the trained run holding an older mesh.ply."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("config.yaml", "point_cloud.ply"):
        (out / name).write_bytes((run_dir / name).read_bytes())
    (out / "mesh.ply").write_bytes(OLD_MESH)
    return out


def _mesh(model, *flags, capsys):
    from splat.render_cli import main

    rc = main(["--model", str(model), "--mesh", "--no-progress", "--mesh-res", "64", *flags])
    # The tiny scene's cameras span little: its depth_trunc warning is not what these tests check,
    # nor the line saying which model (step) is meshed.
    err = capsys.readouterr().err
    return rc, "".join(ln for ln in err.splitlines(True) if not ln.startswith(("warning: ", "model: ")))


def test_an_empty_mesh_is_one_line_and_not_written(model, capsys):
    rc, err = _mesh(model, "--alpha-min", "0.999999", capsys=capsys)
    assert rc == 1
    assert err.splitlines() == [
        f"error: {model / 'mesh.ply'}: not written, the mesh is empty: no pixel of the 8 train views reaches "
        "alpha 0.999999 (--alpha-min); the older mesh.ply is left as it was"
    ], err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH


def test_a_depth_trunc_before_every_surface_is_one_line(model, capsys):
    rc, err = _mesh(model, "--depth-trunc", "1e-9", capsys=capsys)
    assert rc == 1
    assert len(err.splitlines()) == 1 and "every measured depth lies beyond depth_trunc 1e-09" in err, err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_a_depth_trunc_that_is_not_a_finite_positive_number_is_refused(model, capsys, value):
    rc, err = _mesh(model, "--depth-trunc", value, capsys=capsys)
    assert rc == 2
    assert err.splitlines() == [f"error: --depth-trunc: {float(value)} is not a finite number > 0"], err


def test_a_failed_write_is_one_line(model, capsys, monkeypatch):
    """What a read-only folder or a full disk does to open3d's writer: it
    returns False (and prints its own line); splat names the file."""
    from splat.mesh.open3d_import import import_open3d

    o3d = import_open3d()
    monkeypatch.setattr(o3d.io, "write_triangle_mesh", lambda *a, **k: False)
    rc, err = _mesh(model, capsys=capsys)
    assert rc == 1
    assert err.splitlines() == [
        f"error: {model / 'mesh.ply'}: open3d could not write the mesh (disk full or not writable?)"
    ], err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH
    assert sorted(p.name for p in model.iterdir()) == ["config.yaml", "mesh.ply", "point_cloud.ply"]


def test_an_interrupted_write_leaves_the_older_mesh(model, capsys, monkeypatch):
    """SIGTERM in the middle of the write: the half-written file is beside
    mesh.ply, never it, and is removed; one line, exit code 143."""
    from splat.mesh.open3d_import import import_open3d
    from splat.sfm.sigterm import EXIT_CODE, Terminated

    o3d = import_open3d()

    def half_then_terminated(path, mesh, *a, **k):
        Path(path).write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1000\n")
        raise Terminated()

    monkeypatch.setattr(o3d.io, "write_triangle_mesh", half_then_terminated)
    rc, err = _mesh(model, capsys=capsys)
    assert rc == EXIT_CODE
    assert err.splitlines() == ["error: terminated (SIGTERM)"], err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH
    assert sorted(p.name for p in model.iterdir()) == ["config.yaml", "mesh.ply", "point_cloud.ply"]


def test_a_temp_file_left_by_a_killed_writer_is_removed(model, capsys):
    left = model / ".mesh.ply.tmp999999999.ply"  # no such process
    left.write_bytes(b"ply\n")
    rc, err = _mesh(model, capsys=capsys)
    assert rc == 0, err
    assert not left.exists()
    assert (model / "mesh.ply").read_bytes() != OLD_MESH and (model / "mesh.ply").stat().st_size > 0


def test_sigterm_while_meshing_is_one_line(model):
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "render.py"), "--model", str(model), "--mesh", "--mesh-res", "256", "--progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        seen = ""
        deadline = time.monotonic() + 120
        while "fusion" not in seen.lower() and proc.poll() is None and time.monotonic() < deadline:
            seen += os.read(proc.stderr.fileno(), 4096).decode(errors="replace")
        assert proc.poll() is None, seen
        proc.send_signal(signal.SIGTERM)
        err = seen + proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert err.splitlines()[-1].endswith("error: terminated (SIGTERM)"), err
    assert "Traceback" not in err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH


def test_a_resolution_beyond_the_memory_is_refused_before_meshing(model, capsys):
    from splat.render_cli import main

    rc = main(["--model", str(model), "--unbounded", "--no-progress", "--mesh-res", "100000"])
    err = capsys.readouterr().err
    assert rc == 1
    assert len(err.splitlines()) == 1 and err.startswith(
        "error: --mesh-res 100000 (--unbounded): meshing needs about 14901161 GiB, more than the "
    ), err


def test_a_bounded_mesh_beyond_the_memory_is_refused(model, capsys, monkeypatch):
    from splat.mesh import budget

    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 1 << 20)  # 1 MiB
    rc, err = _mesh(model, capsys=capsys)
    assert rc == 1
    assert len(err.splitlines()) == 1 and err.startswith("error: --mesh-res 64: meshing needs about"), err
    assert "more than the 1 MiB available; lower --mesh-res" in err
    assert (model / "mesh.ply").read_bytes() == OLD_MESH


def test_the_bounded_estimate_grows_with_the_resolution_squared():
    """On a plane seen head-on, twice the resolution touches four times the blocks."""
    import numpy as np

    from splat.mesh.budget import bounded_tsdf_bytes
    from splat.mesh.views import FusionView

    H = W = 200
    K = np.array([[200.0, 0, 100], [0, 200.0, 100], [0, 0, 1]])
    view = FusionView(
        rgb=np.zeros((H, W, 3), np.float32), depth=np.full((H, W), 2.0, np.float32), K=K, viewmat=np.eye(4)
    )
    coarse, fine = (bounded_tsdf_bytes([view], 2.0 / res, 4.0) for res in (32, 64))
    assert 3.0 < fine / coarse < 5.0
