"""The viewer without a browser: the camera conversion, the colour maps, loading,
the command's errors, the port choice and the training hook (the page itself is
tested in a real browser in test_viewer_browser.py)."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from viewer_fixtures import ROOT, SAMPLE, first_test_camera, make_viewer_run

from splat.viewer import camera as vc
from splat.viewer.colormap import apply_colormap, describe_range, visualize


def _random_rotations(n, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    # include the branches of matrix_to_quat: 180-degree turns about each axis
    q = np.concatenate([q, [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]]])
    return q


# ------------------------------------------------------------------ camera
def test_viewmat_matches_viser_pose_convention():
    import viser.transforms as tf

    for wxyz in _random_rotations(20):
        pos = np.array([0.3, -1.2, 2.5])
        T_world_camera = tf.SE3.from_rotation_and_translation(tf.SO3(wxyz), pos).as_matrix()
        np.testing.assert_allclose(vc.viewmat_from_pose(wxyz, pos), np.linalg.inv(T_world_camera), atol=1e-12)
        q, p = vc.pose_from_viewmat(vc.viewmat_from_pose(wxyz, pos))
        np.testing.assert_allclose(vc.quat_to_matrix(q), vc.quat_to_matrix(wxyz), atol=1e-12)
        np.testing.assert_allclose(p, pos, atol=1e-12)
        np.testing.assert_allclose(vc.quat_to_matrix(wxyz), tf.SO3(wxyz).as_matrix(), atol=1e-12)


def test_intrinsics_span_the_vertical_field_of_view():
    fov, W, H = math.radians(60), 300, 200
    K = vc.intrinsics(fov, W, H)
    # a point on the top edge of the field of view projects to the image's top edge (y = 0)
    p = np.array([0.0, -math.tan(fov / 2), 1.0])
    assert (K @ p / p[2])[1] == pytest.approx(0.0, abs=1e-9)
    assert K[0, 2] == W / 2 and K[0, 0] == K[1, 1]
    assert vc.fov_y_of(K, H) == pytest.approx(fov)
    cam = vc.camera_from_view([1, 0, 0, 0], [0, 0, 0], fov, W, H, scale=0.5)
    assert (cam.width, cam.height) == (150, 100) and vc.fov_y_of(cam.K.double().numpy(), 100) == pytest.approx(fov)


def test_start_view_reproduces_the_data_camera():
    from splat.testing import look_at_viewmat

    V, K, W, H = first_test_camera()
    start = vc.start_view_from_camera(V.numpy(), K.numpy(), H, target=np.zeros(3))
    again = look_at_viewmat(start.position, start.look_at, up=start.up).numpy()
    np.testing.assert_allclose(again, V.numpy(), atol=1e-9)
    assert start.fov_y == pytest.approx(2 * math.atan(H / 2 / float(K[1, 1])))


# --------------------------------------------------------------- colour maps
def test_colormaps_and_depth_picture():
    for name in ("turbo", "gray", "inferno"):
        c = apply_colormap(np.linspace(0, 1, 50), name)
        assert c.shape == (50, 3) and c.min() >= 0 and c.max() <= 1
    np.testing.assert_allclose(apply_colormap(np.array([0.0, 1.0]), "gray"), [[0, 0, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="colour map"):
        apply_colormap(np.zeros(2), "jet")
    z = torch.linspace(1, 3, 16).reshape(4, 4)
    alpha = torch.ones(4, 4)
    alpha[0, 0] = 0.0
    out = SimpleNamespace(depth=z, alpha=alpha, rgb=torch.zeros(4, 4, 3))
    pic = visualize(out, "Expected depth", (0.2, 0.4, 0.6), "gray")
    assert (pic.lo, pic.hi) == pytest.approx(tuple(np.percentile(z.numpy()[alpha.numpy() > 0], [2, 98])))
    np.testing.assert_array_equal(pic.image[0, 0], [51, 102, 153])  # background where alpha = 0
    assert pic.image[3, 3, 0] == 255 and pic.image[0, 1, 0] == 0
    assert describe_range("Expected depth", "gray", pic).startswith(f"gray: {pic.lo:.4g} .. {pic.hi:.4g}")
    fixed = visualize(out, "Alpha", (0, 0, 0), "gray")
    assert (fixed.lo, fixed.hi) == (0.0, 1.0)


# ------------------------------------------------------------------ loading
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_viewer_run(tmp_path_factory.mktemp("run"))


def test_load_folder_ply_and_checkpoint(run_dir, tmp_path):
    from splat.viewer.load import load_for_viewer

    V, K, W, H = first_test_camera()
    inp = load_for_viewer(run_dir)
    assert inp.model.num_gaussians == 140 and inp.background == (0.1, 0.1, 0.1)
    np.testing.assert_allclose(inp.start.position, -V[:3, :3].T.numpy() @ V[:3, 3].numpy(), atol=1e-5)
    alone = load_for_viewer(run_dir / "point_cloud.ply")  # a PLY next to the run's config: same start
    np.testing.assert_allclose(alone.start.position, inp.start.position)
    # a PLY alone: a camera outside the model, looking at its centre
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "m.ply").write_bytes((run_dir / "point_cloud.ply").read_bytes())
    inp2 = load_for_viewer(lone / "m.ply")
    centre = np.median(inp2.model.means.detach().double().numpy(), axis=0)
    assert np.linalg.norm(inp2.start.look_at - centre) < 1e-6
    # an unfinished run: the newest checkpoint
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "checkpoints").mkdir()
    params = {k: v.detach() for k, v in inp.model.params.items()}
    for step in (5, 10):
        torch.save({"step": step, "params": params, "sh_degree": 0}, ck / "checkpoints" / f"ckpt_{step:07d}_abc.pt")
    assert load_for_viewer(ck).source.endswith("ckpt_0000010_abc.pt")
    # a PLY alone with --data: the data's first test camera (and the default near/far)
    with_data = load_for_viewer(lone / "m.ply", data=SAMPLE)
    np.testing.assert_allclose(with_data.start.position, inp.start.position, atol=1e-5)
    assert (with_data.near, with_data.far) == (0.2, 100.0)


def _view_cli(capsys, *args):
    import importlib.util

    spec = importlib.util.spec_from_file_location("view_cli", ROOT / "view.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    code = mod.main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_view_errors_are_one_line(capsys, tmp_path, run_dir, monkeypatch):
    code, err = _view_cli(capsys, "--model", tmp_path / "nope")
    assert code == 1 and err.strip().splitlines() == [f"error: {tmp_path / 'nope'}: no such file or folder"]
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 10\nproperty float x\nend_header\n\x00\x01")
    code, err = _view_cli(capsys, "--model", bad)
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {bad}")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _view_cli(capsys, "--model", empty)
    assert code == 1 and "neither point_cloud.ply nor a readable checkpoint" in err and len(err.splitlines()) == 1
    code, err = _view_cli(capsys, "--model", run_dir, "--data", tmp_path / "no_scene")
    assert code == 1 and err.strip().splitlines() == [f"error: {tmp_path / 'no_scene'}: no such data folder (--data)"]
    for port in (70000, -1):
        code, err = _view_cli(capsys, "--model", run_dir, "--port", port)
        assert code == 1 and err.strip().splitlines() == [f"error: port {port}: must be 0..65535 (0: any free port)"]
    monkeypatch.setitem(sys.modules, "viser", None)  # viser not installed
    code, err = _view_cli(capsys, "--model", run_dir)
    assert code == 1 and err.startswith('error: viser is not installed: pip install -e ".[viewer]"')


# ---------------------------------------------------------------- the server
def test_port_in_use_picks_a_free_one(run_dir):
    from splat.viewer.load import load_for_viewer
    from splat.viewer.server import ViewerServer

    inp = load_for_viewer(run_dir)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        log = __import__("io").StringIO()
        view = ViewerServer(inp.model, inp.start, port=port, log=log)
        try:
            assert view.port != port
            assert log.getvalue() == f"port {port} is in use: using port {view.port}\n"
            assert view.url == f"http://localhost:{view.port}"
            with urllib.request.urlopen(view.url, timeout=30) as r:
                assert r.status == 200 and b"<html" in r.read(2000).lower()
        finally:
            view.close()
    # port 0 asks for any free port: nothing to report
    log = __import__("io").StringIO()
    view = ViewerServer(inp.model, inp.start, port=0, log=log)
    try:
        assert view.port != 0 and log.getvalue() == ""
    finally:
        view.close()


def _readline(stream, timeout: float) -> str:
    """The next line of ``stream``, or an AssertionError after ``timeout`` s (a hung
    process must fail the test, not hang it)."""
    box = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no line within {timeout} s"
    return box[0]


def test_view_command_prints_the_address_and_serves(run_dir):
    """The documented command, as a user runs it: prints the address, serves the page, Ctrl+C stops it."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "view.py"), "--model", str(run_dir), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            line = _readline(proc.stdout, 120)  # start-up imports torch, loads the data: slow on a busy machine
            assert line.startswith("viewer: 140 surfels from ") and "http://localhost:" in line, line
            url = line.split(" at ")[1].split()[0]
            assert not url.endswith(f":{port}")
            with urllib.request.urlopen(url, timeout=30) as r:
                assert r.status == 200
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
            assert f"port {port} is in use: using port" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _hold_connections(port: int) -> list:
    """Connections that never finish by themselves, each accepted and answered
    by the server before this returns: a plain HTTP keep-alive connection (what
    a browser leaves after loading the page), a connection that sends half a
    request, and a websocket client that will not answer the closing handshake."""
    import viser

    def connect():
        return socket.create_connection(("127.0.0.1", port), timeout=60)

    def read_head(s):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        return data

    http = connect()
    http.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    assert read_head(http).startswith(b"HTTP/1.1 200")
    half = connect()
    half.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
    ws = connect()
    ws.sendall(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + f"Sec-WebSocket-Protocol: viser-v{viser.__version__}\r\n\r\n".encode()
    )
    assert read_head(ws).startswith(b"HTTP/1.1 101")
    return [http, half, ws]


#: The server must be gone this soon after close() / the signal.  Closing waits
#: for no peer (a few milliseconds of work); before the fix it waited 6 s for
#: viser's stop() and then left its thread running.
PROMPT_S = 3.0


def test_close_ends_lingering_connections_at_once(run_dir):
    from splat.viewer.load import load_for_viewer
    from splat.viewer.server import ViewerServer

    inp = load_for_viewer(run_dir)
    view = ViewerServer(inp.model, inp.start, port=0)
    held = []
    try:
        held = _hold_connections(view.port)
    finally:
        t0 = time.perf_counter()
        view.close()
        seconds = time.perf_counter() - t0
        for s in held:
            s.close()
    print(f"close() with {len(held)} lingering connections: {seconds:.2f} s")
    assert not view.server._websock_server._server_thread.is_alive()  # the server's thread finished
    assert seconds < PROMPT_S


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_view_command_stops_promptly_with_connections_open(run_dir, sig):
    """Ctrl+C (or SIGTERM) with a browser's keep-alive connection open: the
    server stops at once and cleanly (its "Server stopped"), exit code 0; a
    connection closed before sending a request leaves no traceback."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # lines arrive as printed
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "view.py"), "--model", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    held = []
    try:
        line = _readline(proc.stdout, 120)
        port = int(line.split(" at ")[1].split()[0].rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=60).close()  # a port check, a browser's unused socket
        held = _hold_connections(port)
        t0 = time.perf_counter()
        proc.send_signal(sig)
        stopped = _readline(proc.stdout, 60)
        seconds = time.perf_counter() - t0
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read()
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"{signal.Signals(sig).name} with {len(held)} connections open: server stopped after {seconds:.2f} s")
    assert stopped == "(viser) Server stopped\n"
    assert seconds < PROMPT_S
    assert "Traceback" not in err, err


def test_training_hook_pauses_and_publishes(run_dir):
    from splat.viewer.load import load_for_viewer
    from splat.viewer.server import TrainingView

    inp = load_for_viewer(run_dir)
    view = TrainingView(inp.model, inp.start, port=0, refresh_s=0.0)
    try:
        trainer = SimpleNamespace(model=inp.model, cfg={"train": {"iterations": 10}})
        view.callback(trainer, 1, {"loss": 0.5})  # idle: returns at once
        view.set_paused(True)
        assert view.ui.pause.label == "Resume training"
        t = threading.Thread(target=view.callback, args=(trainer, 2, {"loss": 0.4}))
        t.start()
        time.sleep(0.5)
        assert t.is_alive()  # training is held in the hook
        view.set_paused(False)
        t.join(timeout=60)
        assert not t.is_alive()
        # with a (pretend) browser connected, the hook publishes a copy of the model and the stats
        view._states[0] = __import__("splat.viewer.server", fromlist=["_ClientState"])._ClientState()
        view.callback(trainer, 3, {"loss": 0.25})
        assert view._model is not inp.model and view._model.num_gaussians == inp.model.num_gaussians
        assert "step 3/10" in view.ui.training_md.content and "loss 0.2500" in view.ui.training_md.content
    finally:
        view.close()


def test_train_with_viewer(tmp_path, capsys):
    """``train.py --viewer``: the run completes with its usual outputs while the viewer serves."""
    from splat.config import load_config
    from splat.viewer.training import train_with_viewer

    cfg = load_config(
        str(ROOT / "configs" / "fast.yaml"), [f"data.path={SAMPLE}", "train.iterations=10", "log.progress=false"]
    )
    assert train_with_viewer(cfg, tmp_path / "out", port=0, keep_serving=False) == 0
    assert (tmp_path / "out" / "point_cloud.ply").is_file()
    assert "viewer: http://localhost:" in capsys.readouterr().err
