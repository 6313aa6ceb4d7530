"""Trainer: config handling, strategy bookkeeping, a short training run that
must improve test PSNR, and kill/resume reproducibility.

The fixture scene (``make_tiny_scene``) is rendered here by splat.rasterize
from a known "teacher" model -- three coloured, textured planes -- into a
COLMAP text layout with 32x32 RGBA images, a noisy point cloud and
ground-truth depth/normal files for the test views.  It is tiny so that the
whole file runs in well under 30 s on 2 CPU cores.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from splat.checkpoints import load_latest_checkpoint
from splat.config import DEFAULT_CONFIG, StrategyConfig, load_config
from splat.errors import ConfigError
from splat.geometry import quat_to_rotmat
from splat.model import GaussianModel
from splat.run_folder import atomic_write, list_checkpoints
from splat.sh import rgb_to_sh
from splat.state import PrimitiveState
from splat.strategy import update_params
from splat.strategy.default import DefaultStrategy
from splat.trainer import Trainer
from splat.training.views import view_index

ROOT = Path(__file__).resolve().parents[1]
SIZE = 32  # image width = height of the fixture, pixels


# ------------------------------------------------------------------ fixture
def _look_at_viewmat(center: np.ndarray, target=None, up=None) -> np.ndarray:
    """World -> camera [4, 4] (OpenCV: x right, y down, z forward) looking at
    ``target`` (default: the origin) with ``up`` (default: +z)."""
    target = np.zeros(3) if target is None else target
    up = np.array([0.0, 0.0, 1.0]) if up is None else up
    z = target - center
    z = z / np.linalg.norm(z)
    x = np.cross(z, up)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    R = np.stack([x, y, z])  # rows: camera axes in world
    V = np.eye(4)
    V[:3, :3] = R
    V[:3, 3] = -R @ center
    return V


def _rotmat_to_quat(R: np.ndarray) -> np.ndarray:
    """(w, x, y, z) for a proper rotation (only used on well-conditioned R here)."""
    w = math.sqrt(max(1.0 + R[0, 0] + R[1, 1] + R[2, 2], 1e-12)) / 2.0
    return np.array([w, (R[2, 1] - R[1, 2]) / (4 * w), (R[0, 2] - R[2, 0]) / (4 * w), (R[1, 0] - R[0, 1]) / (4 * w)])


def teacher_model(seed: int = 0) -> GaussianModel:
    """~300 opaque surfels tiling three planes (floor, back wall, side wall) with
    a random colour per surfel: a textured 'corner' with real geometry."""
    g = torch.Generator().manual_seed(seed)
    pts, normals = [], []
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, 10), torch.linspace(-1, 1, 10), indexing="ij"), -1)
    grid = grid.reshape(-1, 2)  # [100, 2]
    zero = torch.zeros(100)
    pts.append(torch.stack([grid[:, 0], grid[:, 1], zero - 0.5], 1))  # floor z = -0.5
    normals.append(torch.tensor([0.0, 0.0, 1.0]).expand(100, 3))
    pts.append(torch.stack([grid[:, 0], zero - 1.0, grid[:, 1] * 0.5], 1))  # wall y = -1
    normals.append(torch.tensor([0.0, 1.0, 0.0]).expand(100, 3))
    pts.append(torch.stack([zero - 1.0, grid[:, 0], grid[:, 1] * 0.5], 1))  # wall x = -1
    normals.append(torch.tensor([1.0, 0.0, 0.0]).expand(100, 3))
    means = torch.cat(pts)  # [300, 3]
    n = torch.cat(normals)
    # quaternion rotating +z onto the plane normal
    quats = []
    for v in n:
        z = v.numpy()
        x = np.cross([0.3, 0.5, 0.7], z)
        x /= np.linalg.norm(x)
        y = np.cross(z, x)
        quats.append(_rotmat_to_quat(np.stack([x, y, z], 1)))
    N = means.shape[0]
    colors = torch.rand(N, 3, generator=g)
    params = {
        "means": means,
        "quats": torch.tensor(np.array(quats), dtype=torch.float32),
        "scales": torch.full((N, 2), math.log(0.12)),
        "opacities": torch.full((N,), 4.0),  # sigmoid -> 0.98
        "sh0": rgb_to_sh(colors)[:, None],
        "shN": torch.zeros(N, 0, 3),
    }
    return GaussianModel(params, sh_degree=0)


def make_tiny_scene(root: Path, n_views: int = 10, size: int = SIZE) -> Path:
    """Write the fixture scene (COLMAP text layout) to ``root``; returns ``root``.

    Views ``view_000`` .. on an arc in front of the corner; with
    ``test_every=5`` views 0 and 5 are the test split.  ``view_NNN_depth.npy``
    (camera z, median depth of the teacher, 0 where empty) and
    ``view_NNN_normal.npy`` (world normals) are written for every view.
    """
    from PIL import Image

    from splat.model_render import normalized_normals, render_frame

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    teacher = teacher_model()
    f = 0.9 * size
    K = np.array([[f, 0, size / 2], [0, f, size / 2], [0, 0, 1.0]])
    lines_img = []
    for k in range(n_views):
        az = math.radians(20 + 50 * k / max(n_views - 1, 1))  # 20..70 deg, looking at the corner
        el = math.radians(25 + 10 * (k % 3))
        c = 3.5 * np.array([math.cos(az) * math.cos(el), math.sin(az) * math.cos(el), math.sin(el)])
        V = _look_at_viewmat(c)
        stem = f"view_{k:03d}"

        class _F:  # just what render_frame needs
            viewmat = torch.tensor(V, dtype=torch.float32)
            width = height = size

        _F.K = torch.tensor(K, dtype=torch.float32)
        with torch.no_grad():
            out = render_frame(teacher, _F, None, backend="auto")
        a = out.alpha.clamp(0, 1)
        rgb = torch.where(a[..., None] > 0, out.rgb / a[..., None].clamp_min(1e-6), torch.zeros_like(out.rgb))
        rgba = torch.cat([rgb.clamp(0, 1), a[..., None]], -1)
        Image.fromarray((rgba.numpy() * 255 + 0.5).astype(np.uint8), "RGBA").save(root / "images" / f"{stem}.png")
        np.save(root / f"{stem}_depth.npy", (out.median_depth * (a > 0.5)).numpy().astype(np.float32))
        np.save(root / f"{stem}_normal.npy", normalized_normals(out.normal, out.alpha).numpy().astype(np.float32))
        q = _rotmat_to_quat(V[:3, :3])
        t = V[:3, 3]
        lines_img.append(f"{k + 1} {q[0]} {q[1]} {q[2]} {q[3]} {t[0]} {t[1]} {t[2]} 1 {stem}.png\n\n")
    (root / "sparse/0/cameras.txt").write_text(f"1 PINHOLE {size} {size} {f} {f} {size / 2} {size / 2}\n")
    (root / "sparse/0/images.txt").write_text("".join(lines_img))
    # SfM-like points: the teacher's surfel centres plus noise, with greyed colours
    g = torch.Generator().manual_seed(1)
    pts = teacher.means.detach() + 0.03 * torch.randn(teacher.num_gaussians, 3, generator=g)
    lines_pts = [f"{i + 1} {p[0]:.6f} {p[1]:.6f} {p[2]:.6f} 128 128 128 0.5\n" for i, p in enumerate(pts.tolist())]
    (root / "sparse/0/points3D.txt").write_text("".join(lines_pts))
    return root


#: Config overrides used by the training tests: short schedule, densification on.
TINY_OVERRIDES = [
    "data.test_every=5",
    "model.sh_degree=1",
    "train.sh_increase_every=30",
    "loss.dist_from=40",
    "loss.normal_from=50",
    "strategy.refine_start=20",
    "strategy.refine_every=10",
    "strategy.refine_stop=200",
    "strategy.reset_every=1000",  # an opacity reset needs more steps than we run to recover
    "strategy.max_gaussians=600",
    "train.pose_opt_from=0",  # the configs' start is past these runs' last step
    "train.coarse_factor=1",  # full resolution throughout: tests/test_resolution.py tests the coarse start
    "log.progress=false",
]


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory) -> Path:
    return make_tiny_scene(tmp_path_factory.mktemp("tiny_scene"))


def tiny_config(scene: Path, iterations: int, extra=()) -> dict:
    return load_config(
        str(ROOT / "configs" / "default.yaml"),
        [f"data.path={scene}", f"train.iterations={iterations}"] + TINY_OVERRIDES + list(extra),
    )


# ------------------------------------------------------------------- config
def test_config_files_and_overrides():
    for name in ("default", "fast"):
        cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"))
        assert cfg.keys() == DEFAULT_CONFIG.keys()
    cfg = load_config(None, ["loss.dist_lambda=5", "data.background=[0, 0, 0]", "strategy.verbose=true"])
    assert cfg["loss"]["dist_lambda"] == 5 and cfg["data"]["background"] == [0, 0, 0]
    assert cfg["strategy"]["verbose"] is True
    with pytest.raises(ConfigError):
        load_config(None, ["loss.dist_lamda=5"])  # typo must fail loudly
    with pytest.raises(ConfigError):
        load_config(None, ["loss=5"])


def test_view_order_is_a_seeded_permutation_per_epoch():
    n = 7
    epoch0 = [view_index(3, s, n) for s in range(1, n + 1)]
    assert sorted(epoch0) == list(range(n))
    assert epoch0 == [view_index(3, s, n) for s in range(1, n + 1)]
    assert epoch0 != [view_index(3, s, n) for s in range(n + 1, 2 * n + 1)]


# ----------------------------------------------------------------- strategy
def _toy_model(n=6):
    params = {
        "means": torch.randn(n, 3),
        "quats": torch.randn(n, 4),
        "scales": torch.full((n, 2), math.log(0.05)),
        "opacities": torch.zeros(n),
        "sh0": torch.randn(n, 1, 3),
        "shN": torch.zeros(n, 3, 3),
    }
    return GaussianModel(params, 1)


def _toy_optimizers(model):
    opts = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.params.items()}
    for p in model.params.values():  # one step so that Adam has moments
        p.grad = torch.ones_like(p) * torch.arange(p.shape[0]).view(-1, *[1] * (p.dim() - 1))
    for o in opts.values():
        o.step()
    return opts


def test_update_params_keeps_optimizer_state_aligned():
    model = _toy_model()
    opts = _toy_optimizers(model)
    keep = torch.tensor([0, 2, 5])
    before = {k: opts[k].state[p]["exp_avg"].clone() for k, p in model.params.items()}
    update_params(model, opts, lambda name, p: p[keep], lambda key, v: v[keep])
    for k, p in model.params.items():
        assert p.shape[0] == 3
        st = opts[k].state[p]
        assert opts[k].param_groups[0]["params"][0] is p
        assert torch.equal(st["exp_avg"], before[k][keep])
    # the optimiser still steps the new parameters
    for p in model.params.values():
        p.grad = torch.ones_like(p)
    for o in opts.values():
        o.step()


def test_strategy_takes_its_config_section():
    """DefaultStrategy's thresholds come from StrategyConfig (the only place
    their defaults are declared); make_strategy takes the config's section
    as a dict or a StrategyConfig, and names an unknown key."""
    from splat.config import DEFAULT_CONFIG
    from splat.strategy import make_strategy

    assert DefaultStrategy().cfg == StrategyConfig()
    s = make_strategy(dict(DEFAULT_CONFIG["strategy"], refine_every=7), 2.0, seed=3)
    assert isinstance(s, DefaultStrategy) and s.cfg.refine_every == 7 and s.scene_radius == 2.0 and s.seed == 3
    assert make_strategy(StrategyConfig(prune_opa=0.2), 1.0).cfg.prune_opa == 0.2
    with pytest.raises(ValueError, match="strategy.bogus"):
        make_strategy({"name": "default", "bogus": 1}, 1.0)


def test_default_strategy_clone_split_prune_reset():
    model = _toy_model(6)
    opts = _toy_optimizers(model)
    s = DefaultStrategy(
        StrategyConfig(
            grow_grad2d=0.1, grow_scale3d=0.1, prune_opa=0.3, refine_start=0, refine_every=1, reset_every=1000
        ),
        scene_radius=1.0,
    )
    s.bind(PrimitiveState(model, opts))
    # surfels 0, 1 have high gradients; 1 is large (split), 0 small (clone); 5 is transparent (prune)
    with torch.no_grad():
        model.params["scales"][1] = math.log(0.5)
        model.params["opacities"][5] = -5.0
    s._reset_stats(6)
    s.grad2d[:] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    s.count[:] = 1
    means0 = model.params["means"].detach().clone()
    s._refine(model, opts, step=1)
    # 6 + 1 clone + 1 net from split - 1 pruned = 7
    assert model.num_gaussians == 7
    assert s.stats == {"cloned": 1, "split": 1, "pruned": 1}
    means = model.params["means"].detach()
    assert (means == means0[0]).all(1).sum() == 2  # original + clone
    assert torch.allclose(model.scales[-2:], torch.full((2, 2), 0.5 / 1.6))  # split children
    for k, p in model.params.items():
        st = opts[k].state[p]
        assert st["exp_avg"].shape == p.shape and st["exp_avg_sq"].shape == p.shape
        assert not st["exp_avg"][-2:].any()  # split children start with zero moments
    # split children lie in the parent's tangent plane
    parent_n = quat_to_rotmat(model.params["quats"].detach()[-2:])[:, :, 2]
    assert torch.allclose(((means[-2:] - means0[1]) * parent_n).sum(-1), torch.zeros(2), atol=1e-5)
    s._reset_opacity(model, opts)
    assert (model.opacities <= 0.6 + 1e-5).all()
    assert not opts["opacities"].state[model.params["opacities"]]["exp_avg"].any()


# ------------------------------------------------------------- training run
def test_short_training_improves_test_psnr(tiny_scene, tmp_path):
    """100 steps from the noisy, grey point cloud must raise test PSNR by >= 3 dB
    (we observe about +8 dB)."""
    cfg = tiny_config(tiny_scene, 100)
    trainer = Trainer(cfg, tmp_path / "run")
    before = trainer.evaluate()["test.psnr"]
    t0 = time.perf_counter()
    m = trainer.train()
    elapsed = time.perf_counter() - t0
    print(f"test PSNR {before:.2f} -> {m['test.psnr']:.2f} dB in {elapsed:.1f} s, {m['n_gaussians']} surfels")
    assert m["test.psnr"] >= before + 3.0, (before, m["test.psnr"])
    assert m["test"]["psnr"] == m["test.psnr"]
    for key in (
        "test.ssim",
        "n_gaussians",
        "iterations",
        "train_seconds",
        "peak_memory_mb",
        "test.depth_rel_err",
        "test.normal_deg_err",
    ):
        assert key in m and np.isfinite(m[key]), key
    assert m["iterations"] == 100 and m["n_gaussians"] == trainer.model.num_gaussians
    out = tmp_path / "run"
    assert json.loads((out / "metrics.json").read_text())["test.psnr"] == m["test.psnr"]
    assert (out / "point_cloud.ply").is_file() and (out / "config.yaml").is_file()
    assert list_checkpoints(out)  # speed is measured in bench/, not asserted here


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    p = tmp_path / "x.bin"
    atomic_write(p, lambda f: f.write(b"old"))

    def bad(f):
        f.write(b"partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(p, bad)
    assert p.read_bytes() == b"old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["x.bin"]  # no temp file left


def test_an_interrupt_mid_write_is_reported_as_the_interrupt(tmp_path):
    """Ctrl+C or SIGTERM inside torch.save: its zip writer's clean-up then
    fails on the half-written file ("unexpected pos"), an error raised while
    handling the interrupt.  The interrupt must come out (the CLI prints it
    in one line and exits 130/143), not that error with a traceback; the old
    file stays and no temp file is left.  (The race, found by CI in
    test_cli_errors' SIGTERM test, made deterministic here.)"""
    from splat.sfm.sigterm import Terminated

    p = tmp_path / "x.bin"
    atomic_write(p, lambda f: f.write(b"old"))

    class Writer:  # torch.save's zip writer, in miniature
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 100096 vs 99984")

    for interrupt in (KeyboardInterrupt(), Terminated()):

        def interrupted(f, interrupt=interrupt):
            with Writer():
                f.write(b"partial")
                raise interrupt

        with pytest.raises(KeyboardInterrupt) as e:
            atomic_write(p, interrupted)
        assert e.value is interrupt
        assert p.read_bytes() == b"old"
        assert sorted(x.name for x in tmp_path.iterdir()) == ["x.bin"]
    with pytest.raises(RuntimeError):  # an error that is no interrupt stays what it is
        atomic_write(p, lambda f: (_ for _ in ()).throw(RuntimeError("disk full")))


def _train_cmd(scene, out, iterations, *extra):
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "--data",
        str(scene),
        "--out",
        str(out),
        "--iterations",
        str(iterations),
        "--no-progress",
        *TINY_OVERRIDES,
        "checkpoint.every=10",
        "checkpoint.keep=50",
        *extra,
    ]


#: The resume test crosses every kind of state: densification (clone, split,
#: prune), an opacity reset, SH degree increases and the loss warm-ups.
RESUME_EXTRA = ["strategy.reset_every=30", "data.random_background=true"]


def _final_params(out: Path) -> dict:
    return load_latest_checkpoint(out)["params"]


@pytest.mark.parametrize("batch, primitive", [(1, "2dgs"), (2, "2dgs"), (1, "3dgs")])
def test_resume_after_sigkill_reproduces_uninterrupted_run(tiny_scene, tmp_path, batch, primitive):
    """Kill training (SIGKILL) right after its first checkpoint, resume, and
    compare with an uninterrupted run: same surfel count, parameters equal to
    atol 1e-5 (the loop is deterministic: seeded view order and RNG states in
    the checkpoint; we observe bit-identical results on CPU).  With
    ``train.batch_size=2`` too: a step's views follow from the step alone;
    and with 3D Gaussians."""
    iters = 60
    extra = RESUME_EXTRA + [f"train.batch_size={batch}", f"model.primitive={primitive}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    full, killed = tmp_path / "full", tmp_path / "killed"
    ref = subprocess.Popen(
        _train_cmd(tiny_scene, full, iters, *extra), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    proc = subprocess.Popen(
        _train_cmd(tiny_scene, killed, iters, *extra), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 60
    while not list_checkpoints(killed) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = list_checkpoints(killed)
    assert done, "no checkpoint was written"
    assert not (killed / "metrics.json").exists(), "run finished before it could be killed"
    killed_at = load_latest_checkpoint(killed)["step"]
    assert killed_at < iters

    # A checkpoint truncated mid-write must never be picked: neither a stray
    # temp file nor a (non-atomically written) corrupt newest file.
    good = done[0].read_bytes()
    run_id = done[0].stem.split("_")[-1]
    tmp = killed / "checkpoints" / f".ckpt_{iters:07d}_{run_id}.pt.tmp999"
    tmp.write_bytes(good[: len(good) // 2])
    corrupt = killed / "checkpoints" / f"ckpt_{iters - 1:07d}_{run_id}.pt"
    corrupt.write_bytes(good[: len(good) // 2])
    assert load_latest_checkpoint(killed)["step"] == killed_at

    res = subprocess.run(
        _train_cmd(tiny_scene, killed, iters, *extra, "--resume"), env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"at step {killed_at}" in res.stderr
    assert not tmp.exists(), "temp file of the killed writer not cleaned at start"
    assert not corrupt.exists() and corrupt.with_name(corrupt.name + ".corrupt").exists()
    assert ref.wait(timeout=120) == 0, ref.stderr.read().decode()[-3000:]
    a, b = _final_params(full), _final_params(killed)
    assert load_latest_checkpoint(killed)["step"] == iters
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=0), (k, (a[k] - b[k]).abs().max())


def test_step_callbacks_see_every_step(tiny_scene, tmp_path):
    """The per-step hook (used by viewers): called once per step, in order, after
    the step's checkpoint; time spent in it is not counted as training time."""
    seen = []

    def hook(trainer, step, terms):
        seen.append((step, trainer.step, sorted(terms), len(list_checkpoints(trainer.out_dir))))
        time.sleep(0.2)

    cfg = tiny_config(tiny_scene, 4, ["checkpoint.every=2"])
    trainer = Trainer(cfg, tmp_path / "run", callbacks=[hook])
    t0 = time.perf_counter()
    m = trainer.train()
    elapsed = time.perf_counter() - t0
    assert [s[:2] for s in seen] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert {"loss", "psnr"} <= set(seen[0][2])
    assert [s[3] for s in seen] == [0, 1, 1, 2]
    assert m["train_seconds"] + 4 * 0.2 <= elapsed, (m["train_seconds"], elapsed)
