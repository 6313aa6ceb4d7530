"""render.py smoke test: file names, shapes and dtypes of every output, and
the --mesh path (exit code 2 with an install hint when open3d is missing)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_train import SIZE, make_tiny_scene, tiny_config  # tests/ is on sys.path under pytest

from splat.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["2dgs", "3dgs"])
def trained(tmp_path_factory, request):
    """A 20-step model of the tiny fixture scene, surfels or 3D Gaussians
    (every render.py path, TSDF meshes included, for both): (scene dir,
    output dir, test stems)."""
    scene = make_tiny_scene(tmp_path_factory.mktemp("scene"))
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(tiny_config(scene, 20, [f"model.primitive={request.param}"]), out)
    trainer.train()
    return scene, out, [f.stem for f in trainer.scene.test]


def _run(*args):
    return subprocess.run([sys.executable, str(ROOT / "render.py"), *args], capture_output=True, text=True, timeout=120)


def test_render_split_outputs(trained):
    scene, out, stems = trained
    assert stems == ["view_000", "view_005"]  # test_every=5 over 10 name-sorted views
    res = _run("--model", str(out), "--split", "test", "--no-progress")  # data dir from config.yaml
    assert res.returncode == 0, res.stderr[-3000:]
    root = out / "renders" / "test"
    for sub, ext in (("rgb", "png"), ("depth", "npy"), ("normal", "npy"), ("alpha", "npy")):
        assert sorted(p.name for p in (root / sub).iterdir()) == [f"{s}.{ext}" for s in stems], sub
    for s in stems:
        rgb = np.asarray(Image.open(root / "rgb" / f"{s}.png"))
        assert rgb.shape == (SIZE, SIZE, 3) and rgb.dtype == np.uint8
        depth = np.load(root / "depth" / f"{s}.npy")
        normal = np.load(root / "normal" / f"{s}.npy")
        alpha = np.load(root / "alpha" / f"{s}.npy")
        assert depth.shape == (SIZE, SIZE) and depth.dtype == np.float32
        assert normal.shape == (SIZE, SIZE, 3) and normal.dtype == np.float32
        assert alpha.shape == (SIZE, SIZE) and alpha.dtype == np.float32
        hit = alpha > 0
        assert hit.any() and (alpha >= 0).all() and (alpha <= 1 + 1e-6).all()
        assert (depth[hit] > 0).all() and (depth[~hit] == 0).all()
        assert np.allclose(np.linalg.norm(normal[hit], axis=-1), 1.0, atol=1e-4)  # unit where covered
        # camera-space z of the fixture's surfaces: cameras sit 3.5 from the origin
        assert 1.0 < float(np.median(depth[alpha > 0.5])) < 6.0


def test_render_explicit_data_and_train_split(trained, tmp_path):
    scene, out, _ = trained
    res = _run("--model", str(out), "--data", str(scene), "--split", "train", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list((out / "renders" / "train" / "rgb").glob("*.png"))) == 8


def test_render_in_a_pipe_prints_no_bar_unless_forced(trained):
    """Piped (a log, nohup, CI): no tqdm carriage returns by default;
    ``--progress`` forces the bar, as for train.py (issue 20)."""
    _, out, _ = trained
    for flag, bar in (((), False), (("--progress",), True)):
        # Bytes, not text=True: universal newlines would turn every "\r" into "\n".
        res = subprocess.run(
            [sys.executable, str(ROOT / "render.py"), "--model", str(out), *flag],
            capture_output=True,
            timeout=120,
        )
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode == 0, err[-3000:]
        assert ("\r" in err) is bar, err
        assert "wrote 2 test views" in err


def test_render_mesh(trained, capsys):
    from splat.render_cli import main

    _, out, _ = trained
    rc = main(["--model", str(out), "--mesh", "--no-progress", "--mesh-res", "128"])
    err = capsys.readouterr().err
    if importlib.util.find_spec("open3d") is None:
        assert rc == 2
        assert "pip install open3d" in err
    else:
        assert rc == 0, err[-3000:]
        assert (out / "mesh.ply").stat().st_size > 0
        assert " 0 vertices" not in err


def test_render_bad_model_dir(tmp_path, capsys):
    from splat.render_cli import main

    assert main(["--model", str(tmp_path / "nope")]) == 1
    assert "config.yaml" in capsys.readouterr().err


def test_render_a_model_without_surfels_is_an_error(trained, tmp_path, capsys):
    """Every image would be the background alone: one line naming the model file, nothing written."""
    from plyfile import PlyData, PlyElement

    from splat.render_cli import main

    _, out, _ = trained
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(out / "config.yaml", run / "config.yaml")
    names = [
        "x",
        "y",
        "z",
        "f_dc_0",
        "f_dc_1",
        "f_dc_2",
        "opacity",
        "scale_0",
        "scale_1",
        "rot_0",
        "rot_1",
        "rot_2",
        "rot_3",
    ]
    empty = np.zeros(0, dtype=[(n, "f4") for n in names])
    PlyData([PlyElement.describe(empty, "vertex")]).write(str(run / "point_cloud.ply"))
    assert main(["--model", str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {run / 'point_cloud.ply'}: the model has no surfels: nothing to render\n", err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "point_cloud.ply"]
