"""The training loop: config, initialisation, optimisation, checkpoints, metrics.

No argument parsing here (see ``train.py``).  Typical use::

    from splat.trainer import load_config, Trainer
    cfg = load_config("configs/fast.yaml", ["train.iterations=2000"])
    metrics = Trainer(cfg, "output/run").train()

Output folder layout::

    OUT/config.yaml            resolved config (every field)
    OUT/checkpoints/ckpt_NNNNNN.pt   atomic checkpoints (the newest ``checkpoint.keep``)
    OUT/point_cloud.ply        final model, INRIA attribute names (splat.model.save_ply)
    OUT/metrics.json           test metrics, n_gaussians, iterations, train_seconds, peak_memory_mb

Determinism / resume: everything random is drawn from generators seeded by
``seed`` whose state is saved in every checkpoint: the torch, numpy and python
global RNGs (initialisation, splits, random backgrounds) and the view order,
which is a pure function of ``(seed, epoch)``.  A run resumed from a
checkpoint therefore replays exactly the steps the uninterrupted run would
have taken.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .losses import psnr, ssim, total_loss
from .model import GaussianModel, create_from_points, random_points_in_frustums, save_ply
from .render import normalized_normals, render_frame
from .strategy import make_strategy

# ----------------------------------------------------------------- config
#: Every config field with its default.  configs/*.yaml override a subset;
#: ``key=value`` command-line overrides use dotted paths into this tree.
DEFAULT_CONFIG: Dict = {
    "seed": 0,
    "device": "auto",  # auto | cpu | cuda
    "data": {
        "path": "data/sample_scene",
        "layout": "auto",  # auto | colmap | nerf
        "downscale": 1,
        "test_every": 8,  # COLMAP test split: every n-th image
        "background": [1.0, 1.0, 1.0],  # RGBA images are composited over this; also the render background
        "random_background": False,  # train on a random background each step (needs RGBA images)
    },
    "model": {
        "sh_degree": 3,  # max SH degree
        "init": "auto",  # auto (points if the scene has them) | points | random
        "init_num_random": 10000,  # number of random points when there is no point cloud
        "init_random_min_views": 0.5,  # random points must be seen by this fraction of train cameras
        "init_opacity": 0.1,
        "init_scale": 1.0,  # x mean distance to the 3 nearest neighbours
    },
    "train": {
        "iterations": 30000,
        "sh_increase_every": 1000,  # one more SH degree every n steps
        "lr": {
            "means": 1.6e-4,  # x scene_radius, decays exponentially to means_final
            "means_final": 1.6e-6,  # x scene_radius
            "sh0": 2.5e-3,
            "shN": 1.25e-4,  # sh0 / 20
            "opacities": 5e-2,
            "scales": 5e-3,
            "quats": 1e-3,
        },
    },
    "loss": {
        "ssim_lambda": 0.2,
        "dist_lambda": 100.0,
        "dist_from": 3000,
        "normal_lambda": 0.05,
        "normal_from": 7000,
        "depth_for_normal": "expected",  # expected | median
    },
    "strategy": {
        "name": "default",  # default | none
        "prune_opa": 0.005,
        "grow_grad2d": 0.0002,
        "grow_scale3d": 0.01,
        "grow_scale2d": 0.05,
        "prune_scale3d": 0.1,
        "prune_scale2d": 0.15,
        "refine_scale2d_stop": 0,
        "refine_start": 500,
        "refine_stop": 15000,
        "refine_every": 100,
        "reset_every": 3000,
        "pause_refine_after_reset": 0,
        "max_gaussians": 0,  # 0 = no cap
        "verbose": False,
    },
    "render": {
        "backend": "auto",  # passed to splat.rasterize
        "near": 0.2,
        "far": 100.0,
        "depth": "expected",  # depth written by render.py and used for metrics/mesh: expected | median
    },
    "checkpoint": {
        "every": 1000,  # steps; a checkpoint is always written at the end
        "keep": 2,  # newest checkpoints kept
    },
    "log": {
        "progress": True,  # tqdm bar
        "every": 10,  # progress-bar postfix refresh period (steps)
    },
}


def _parse_value(text: str):
    import yaml

    return yaml.safe_load(text) if text != "" else ""


def set_dotted(cfg: Dict, key: str, value) -> None:
    """``set_dotted(cfg, "loss.dist_lambda", 10)``; unknown keys raise KeyError
    (typos should fail loudly instead of silently training something else)."""
    parts = key.split(".")
    node = cfg
    for i, p in enumerate(parts[:-1]):
        if p not in node or not isinstance(node[p], dict):
            raise KeyError(f"unknown config key {'.'.join(parts[: i + 1])!r} (in {key!r})")
        node = node[p]
    if parts[-1] not in node:
        raise KeyError(f"unknown config key {key!r}")
    if isinstance(node[parts[-1]], dict) and not isinstance(value, dict):
        raise KeyError(f"config key {key!r} is a section, not a value")
    node[parts[-1]] = value


def _merge(base: Dict, override: Dict, prefix: str = "") -> None:
    for k, v in override.items():
        path = f"{prefix}{k}"
        if k not in base:
            raise KeyError(f"unknown config key {path!r}")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise KeyError(f"config key {path!r} is a section, not a value")
            _merge(base[k], v, path + ".")
        else:
            base[k] = v


def load_config(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Dict:
    """Defaults <- YAML file (optional) <- ``key=value`` overrides (YAML-parsed values)."""
    import yaml

    cfg = copy.deepcopy(DEFAULT_CONFIG)
    if path is not None:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
        _merge(cfg, data)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value")
        key, text = item.split("=", 1)
        set_dotted(cfg, key.strip(), _parse_value(text.strip()))
    return cfg


def save_config(cfg: Dict, path: Path) -> None:
    import yaml

    atomic_write_bytes(Path(path), yaml.safe_dump(cfg, sort_keys=False).encode())


# --------------------------------------------------------- atomic writes
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write_fn) -> None:
    """Write via ``write_fn(fileobj)`` to a temp file in the same folder, fsync
    it, then ``os.replace`` it onto ``path``: readers see the old file or the
    complete new one, never a partial one, even after SIGKILL or power loss."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


# ------------------------------------------------------------ checkpoints
CKPT_PREFIX = "ckpt_"


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"{CKPT_PREFIX}{step:07d}.pt"


def list_checkpoints(out_dir: Path) -> List[Path]:
    """Complete checkpoint files, newest (highest step) first.  Temp files
    (``.ckpt_*.tmpPID``) left by a killed writer never match."""
    d = Path(out_dir) / "checkpoints"
    if not d.is_dir():
        return []
    found = []
    for p in d.glob(f"{CKPT_PREFIX}*.pt"):
        try:
            found.append((int(p.stem[len(CKPT_PREFIX):]), p))
        except ValueError:
            continue
    return [p for _, p in sorted(found, reverse=True)]


def load_latest_checkpoint(out_dir: Path) -> Optional[dict]:
    """The newest checkpoint that loads; unreadable ones are skipped with a
    warning (defence in depth: atomic writes should make them impossible)."""
    for p in list_checkpoints(out_dir):
        try:
            ckpt = torch.load(p, map_location="cpu", weights_only=True)
            if not isinstance(ckpt, dict) or "step" not in ckpt:
                raise ValueError("not a splat checkpoint")
            ckpt["path"] = str(p)
            return ckpt
        except Exception as e:  # truncated / corrupt file
            print(f"warning: skipping unreadable checkpoint {p}: {type(e).__name__}: {e}", file=sys.stderr)
    return None


def _rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------- helpers
def view_index(seed: int, step: int, n_views: int) -> int:
    """Training view of 1-based ``step``: a fresh seeded permutation per epoch.

    Stateless, so resuming needs no view-order state beyond ``seed``."""
    epoch, pos = divmod(step - 1, n_views)
    return int(np.random.default_rng([int(seed), int(epoch)]).permutation(n_views)[pos])


def means_lr(step: int, iterations: int, lr_init: float, lr_final: float) -> float:
    """Exponential decay from lr_init (step 0) to lr_final (last step)."""
    t = min(max(step / max(iterations, 1), 0.0), 1.0)
    return math.exp((1 - t) * math.log(lr_init) + t * math.log(lr_final))


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA allocation on GPU, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_optimizers(model: GaussianModel, lr: Dict, scene_radius: float) -> Dict[str, torch.optim.Adam]:
    """One Adam per parameter (lets the strategy edit rows of one parameter's moments)."""
    rates = {
        "means": lr["means"] * scene_radius,
        "quats": lr["quats"],
        "scales": lr["scales"],
        "opacities": lr["opacities"],
        "sh0": lr["sh0"],
        "shN": lr["shN"],
    }
    # eps=1e-15 as in 3DGS: parameters with tiny gradients (SH rest) still move.
    return {
        name: torch.optim.Adam([model.params[name]], lr=rates[name], eps=1e-15)
        for name in model.params.keys()
    }


def gt_image(frame, background: torch.Tensor, cfg_background: torch.Tensor) -> torch.Tensor:
    """Target image over ``background``.  Frames are composited over the
    configured background by the loader; with a mask we re-composite."""
    if frame.mask is None or torch.equal(background, cfg_background):
        return frame.image
    a = frame.mask[..., None]  # [H, W, 1]
    return frame.image + (1.0 - a) * (background - cfg_background).view(1, 1, 3)


def _gt_geometry(data_dir: Path, stem: str, H: int, W: int):
    """Ground-truth depth/normal next to the data (``<stem>_depth.npy`` /
    ``<stem>_normal.npy``), nearest-sampled at pixel centres if the images
    were downscaled.  Returns (depth [H,W] or None, normal [H,W,3] or None)."""
    out = []
    for suffix in ("depth", "normal"):
        p = Path(data_dir) / f"{stem}_{suffix}.npy"
        if not p.is_file():
            out.append(None)
            continue
        a = np.load(p).astype(np.float32)
        if a.shape[0] != H or a.shape[1] != W:
            sy, sx = a.shape[0] / H, a.shape[1] / W
            rows = np.minimum(((np.arange(H) + 0.5) * sy).astype(int), a.shape[0] - 1)
            cols = np.minimum(((np.arange(W) + 0.5) * sx).astype(int), a.shape[1] - 1)
            a = a[rows][:, cols]
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return out[0], out[1]


# ---------------------------------------------------------------- trainer
class Trainer:
    """Owns the scene, model, optimisers and strategy of one run in ``out_dir``."""

    def __init__(self, cfg: Dict, out_dir, resume: bool = False, scene=None):
        from .data import load_scene

        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.device = resolve_device(cfg["device"])
        dcfg = cfg["data"]
        self.background = torch.tensor(dcfg["background"], dtype=torch.float32).reshape(3)
        self.scene = scene if scene is not None else load_scene(
            dcfg["path"], downscale=dcfg["downscale"], background=dcfg["background"],
            test_every=dcfg["test_every"], layout=dcfg["layout"],
        )
        if not self.scene.train:
            raise ValueError(f"{dcfg['path']}: no training images")
        self.scene_radius = float(self.scene.scene_radius())
        self.step = 0  # completed steps
        self.train_seconds = 0.0
        seed_everything(cfg["seed"])

        ckpt = load_latest_checkpoint(self.out_dir) if resume else None
        if resume and ckpt is None:
            print(f"no checkpoint in {self.out_dir / 'checkpoints'}: starting from scratch", file=sys.stderr)
        if ckpt is not None:
            self.model = GaussianModel(ckpt["params"], ckpt["sh_degree"])
        else:
            self.model = self._init_model()
        self.model.to(self.device)
        self.optimizers = make_optimizers(self.model, cfg["train"]["lr"], self.scene_radius)
        self.strategy = make_strategy(cfg["strategy"], self.scene_radius)
        if ckpt is not None:
            for name, opt in self.optimizers.items():
                opt.load_state_dict(ckpt["optimizers"][name])
            self.strategy.load_state_dict(ckpt["strategy"])
            _set_rng_state(ckpt["rng"])
            self.step = int(ckpt["step"])
            self.train_seconds = float(ckpt.get("train_seconds", 0.0))
            print(f"resumed from {ckpt['path']} at step {self.step}", file=sys.stderr)

    # ------------------------------------------------------------ init
    def _init_model(self) -> GaussianModel:
        mcfg = self.cfg["model"]
        use_points = mcfg["init"] == "points" or (mcfg["init"] == "auto" and self.scene.points is not None)
        if use_points:
            if self.scene.points is None or len(self.scene.points) == 0:
                raise ValueError("model.init=points but the scene has no point cloud")
            pts, cols = self.scene.points, self.scene.point_colors
        else:
            pts = self._random_points(mcfg["init_num_random"], mcfg["init_random_min_views"])
            cols = torch.full_like(pts, 0.5)  # neutral grey: the photometric loss sets colours fast
        return create_from_points(pts, cols, mcfg["sh_degree"], mcfg["init_opacity"], mcfg["init_scale"])

    def _random_points(self, n: int, min_views: float) -> torch.Tensor:
        """Points in the ball around the mean camera centre (radius = scene
        radius) that at least ``min_views`` of the train cameras see: for an
        inward-looking capture this is the region of interest."""
        frames = self.scene.train
        viewmats = torch.stack([f.viewmat for f in frames]).float()  # [C, 4, 4]
        Ks = torch.stack([f.K for f in frames]).float()  # [C, 3, 3]
        centers = torch.stack([f.camera_center for f in frames]).float()  # [C, 3]
        return random_points_in_frustums(
            n, viewmats, Ks, frames[0].width, frames[0].height,
            centers.mean(0), self.scene_radius, min_views=min_views,
        )

    # ------------------------------------------------------------ loop
    def render(self, frame, background=None, sh_degree=None):
        r = self.cfg["render"]
        bg = self.background if background is None else background
        return render_frame(
            self.model, frame, bg.to(self.device), sh_degree=sh_degree,
            backend=r["backend"], near=r["near"], far=r["far"], device=self.device,
        )

    def sh_degree_at(self, step: int) -> int:
        return min(step // max(self.cfg["train"]["sh_increase_every"], 1), self.model.sh_degree)

    def train_step(self, step: int) -> dict:
        """One optimisation step (1-based ``step``); returns logging terms."""
        cfg = self.cfg
        iterations = cfg["train"]["iterations"]
        frames = self.scene.train
        frame = frames[view_index(cfg["seed"], step, len(frames))]
        lr = cfg["train"]["lr"]
        for g in self.optimizers["means"].param_groups:
            g["lr"] = means_lr(step, iterations, lr["means"], lr["means_final"]) * self.scene_radius

        bg = self.background
        if cfg["data"]["random_background"] and frame.mask is not None:
            bg = torch.rand(3)
        gt = gt_image(frame, bg, self.background).to(self.device)
        out = self.render(frame, bg, self.sh_degree_at(step))
        K = frame.K.to(self.device)
        viewmat = frame.viewmat.to(self.device)
        loss, terms = total_loss(out, gt, K, viewmat, step, cfg["loss"])
        self.strategy.step_pre_backward(self.model, self.optimizers, out, step)
        loss.backward()
        for opt in self.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.strategy.step_post_backward(self.model, self.optimizers, out, step)
        terms["loss"] = float(loss.detach())
        terms["psnr"] = psnr(out.rgb, gt)
        return terms

    def train(self) -> dict:
        """Run (or continue) training to ``train.iterations``; write outputs; return metrics."""
        cfg = self.cfg
        iterations = int(cfg["train"]["iterations"])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.out_dir / "config.yaml")
        every = int(cfg["checkpoint"]["every"])
        bar = None
        if cfg["log"]["progress"]:
            from tqdm import tqdm

            bar = tqdm(total=iterations, initial=self.step, desc="train", dynamic_ncols=True, smoothing=0.1)
        t0 = time.perf_counter()
        ema = None
        while self.step < iterations:
            step = self.step + 1
            terms = self.train_step(step)
            self.step = step
            ema = terms if ema is None else {k: 0.9 * ema.get(k, v) + 0.1 * v for k, v in terms.items()}
            if bar is not None:
                bar.update(1)
                if step % cfg["log"]["every"] == 0 or step == iterations:
                    bar.set_postfix(loss=f"{ema['loss']:.4f}", psnr=f"{ema['psnr']:.2f}", n=self.model.num_gaussians)
            if (every > 0 and step % every == 0) or step == iterations:
                self.train_seconds += time.perf_counter() - t0
                t0 = time.perf_counter()
                self.save_checkpoint()
        self.train_seconds += time.perf_counter() - t0
        if bar is not None:
            bar.close()
        save_ply(self.model, self.out_dir / "point_cloud.ply")
        metrics = self.evaluate()
        atomic_write_bytes(self.out_dir / "metrics.json", (json.dumps(metrics, indent=2) + "\n").encode())
        self._print_summary(metrics)
        return metrics

    # ------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        state = {
            "step": self.step,
            "sh_degree": self.model.sh_degree,
            "params": {k: v.cpu() for k, v in self.model.raw_state().items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "strategy": self.strategy.state_dict(),
            "rng": _rng_state(),
            "train_seconds": self.train_seconds,
            "config": self.cfg,
        }
        path = checkpoint_path(self.out_dir, self.step)
        atomic_write(path, lambda f: torch.save(state, f))
        keep = max(int(self.cfg["checkpoint"]["keep"]), 1)
        for old in list_checkpoints(self.out_dir)[keep:]:
            old.unlink(missing_ok=True)
        return path

    # ------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, frames=None) -> dict:
        """Test-set metrics (see module doc of ``splat/render.py`` for the depth choice)."""
        frames = self.scene.test if frames is None else frames
        metrics = {
            "n_gaussians": self.model.num_gaussians,
            "iterations": self.step,
            "train_seconds": round(self.train_seconds, 3),
            "peak_memory_mb": round(peak_memory_mb(self.device), 1),
        }
        test = evaluate_frames(self, frames)
        metrics.update({f"test.{k}": v for k, v in test.items()})
        metrics["test"] = test  # nested copy too: metrics["test"]["psnr"]
        return metrics

    def _print_summary(self, m: dict) -> None:
        parts = [f"{self.step} steps in {m['train_seconds']:.1f} s", f"{m['n_gaussians']} surfels"]
        for k in ("psnr", "ssim", "depth_rel_err", "normal_deg_err"):
            if f"test.{k}" in m and m[f"test.{k}"] is not None:
                parts.append(f"test {k} {m[f'test.{k}']:.4g}")
        parts.append(f"peak mem {m['peak_memory_mb']:.0f} MB")
        print("done: " + ", ".join(parts) + f" -> {self.out_dir}", file=sys.stderr)


def evaluate_frames(trainer: "Trainer", frames) -> dict:
    """Mean PSNR/SSIM over ``frames``, plus depth/normal errors where ground
    truth files exist next to the data (pixels with z_gt > 0)."""
    if not frames:
        return {}
    psnrs, ssims = [], []
    depth_err_sum, normal_err_sum, n_px = 0.0, 0.0, 0
    data_dir = Path(trainer.cfg["data"]["path"])
    use_median = trainer.cfg["render"]["depth"] == "median"
    for f in frames:
        out = trainer.render(f)
        rgb = out.rgb.clamp(0, 1).cpu()
        psnrs.append(psnr(rgb, f.image))
        ssims.append(float(ssim(rgb, f.image)))
        z_gt, n_gt = _gt_geometry(data_dir, f.stem, f.height, f.width)
        if z_gt is None:
            continue
        valid = z_gt > 0
        if not bool(valid.any()):
            continue
        z = (out.median_depth if use_median else out.depth).cpu()
        depth_err_sum += float(((z - z_gt).abs() / z_gt.clamp_min(1e-12))[valid].sum())
        if n_gt is not None:
            n = normalized_normals(out.normal.cpu(), out.alpha.cpu())
            ngt = n_gt / n_gt.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            cos = (n * ngt).sum(-1).abs().clamp(0, 1)  # GT normals are not oriented
            normal_err_sum += float(torch.rad2deg(torch.acos(cos))[valid].sum())
        n_px += int(valid.sum())
    res = {"psnr": float(np.mean(psnrs)), "ssim": float(np.mean(ssims)), "num_views": len(frames)}
    if n_px > 0:
        res["depth_rel_err"] = depth_err_sum / n_px
        res["normal_deg_err"] = normal_err_sum / n_px
    return res


def train(cfg: Dict, out_dir, resume: bool = False) -> dict:
    """Convenience: ``Trainer(cfg, out_dir, resume).train()``."""
    return Trainer(cfg, out_dir, resume=resume).train()
