"""The training loop: initialisation, optimisation, metrics.

Config: ``splat/config.py``; checkpoints and atomic writes: ``splat/checkpoint.py``.

No argument parsing here (see ``train.py``).  Typical use::

    from splat.config import load_config
    from splat.trainer import Trainer
    cfg = load_config("configs/fast.yaml", ["train.iterations=2000"])
    metrics = Trainer(cfg, "output/run").train()

Output folder layout::

    OUT/config.yaml            resolved config (every field)
    OUT/checkpoints/ckpt_NNNNNNN.pt  atomic checkpoints (the newest ``checkpoint.keep``)
    OUT/point_cloud.ply        final model, INRIA attribute names (splat.model.save_ply)
    OUT/metrics.json           test metrics, n_gaussians, iterations, train_seconds, peak_memory_mb
                               (test.psnr_masked / test.ssim_masked inside the object masks: eval.masked)

Determinism / resume: everything random is drawn from generators seeded by
``seed`` whose state is saved in every checkpoint: the torch, numpy and python
global RNGs (initialisation, splits, random backgrounds) and the view order,
which is a pure function of ``(seed, epoch)``.  A run resumed from a
checkpoint therefore replays exactly the steps the uninterrupted run would
have taken.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Sequence

import numpy as np
import torch

from .checkpoint import (
    RunLock,
    atomic_write,
    atomic_write_bytes,
    check_out_dir,
    checkpoint_path,
    claim_out_dir,
    clean_temp_files,
    load_latest_checkpoint,
    prune_checkpoints,
    rng_state,
    run_identity,
    save_config,
    seed_everything,
    set_rng_state,
)
from .appearance import make_appearance, make_optimizer
from .config import check_config
from .evaluation import check_eval_masks, evaluate_frames
from .errors import RunStateError, SplatInputError
from .losses import psnr, total_loss
from .model import GaussianModel, create_from_points, save_ply
from .progress import LogLines, format_duration, use_progress_bar  # noqa: F401 (re-exported)
from .devices import peak_memory_mb, resolve_device  # noqa: F401 (re-exported)
from .render import render_frame
from .strategy import make_strategy

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
    # fused=True: one elementwise kernel per parameter instead of a dozen
    # whole-array ops (measured 3-6x faster at 200k surfels on the CPU).
    return {
        name: torch.optim.Adam([model.params[name]], lr=rates[name], eps=1e-15, fused=True)
        for name in model.params.keys()
    }


def gt_image(frame, background: torch.Tensor, cfg_background: torch.Tensor) -> torch.Tensor:
    """Target image over ``background``.  Frames are composited over the
    configured background by the loader; with a mask we re-composite."""
    if frame.mask is None or torch.equal(background, cfg_background):
        return frame.image
    a = frame.mask[..., None]  # [H, W, 1]
    return frame.image + (1.0 - a) * (background - cfg_background).view(1, 1, 3)


# ---------------------------------------------------------------- trainer
#: A per-step hook: ``callback(trainer, step, terms)`` runs after every
#: completed step (and its checkpoint, if one was due); ``terms`` are that
#: step's logging terms (loss, psnr, ...).  A callback may block to pause
#: training (e.g. a viewer's pause button) and may read ``trainer.model``.
StepCallback = Callable[["Trainer", int, dict], None]


class Trainer:
    """Owns the scene, model, optimisers and strategy of one run in ``out_dir``.

    ``callbacks``: :data:`StepCallback` hooks called after every step."""

    def __init__(self, cfg: Dict, out_dir, resume: bool = False, scene=None,
                 callbacks: Sequence[StepCallback] = (), overwrite: bool = False):
        from .data import load_scene_from_config

        cfg = check_config(cfg)
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self.out_dir = check_out_dir(Path(out_dir))  # before the (slow) data loading
        self.device = resolve_device(cfg["device"])
        dcfg = cfg["data"]
        self.background = torch.tensor(dcfg["background"], dtype=torch.float32).reshape(3)
        self.scene = scene if scene is not None else load_scene_from_config(
            dcfg, eval_masks=cfg["eval"]["masked"] is not False)
        if not self.scene.train:
            raise SplatInputError(f"{dcfg['path']}: no training images")
        check_eval_masks(cfg, self.scene)  # before the (long) training, not at its end
        self.scene_radius = float(self.scene.scene_radius())
        self.step = 0  # completed steps
        self.train_seconds = 0.0
        self.identity = run_identity(cfg, self.scene)
        self.run_id = self.identity["run_id"]
        self._lock = RunLock(self.out_dir)
        try:
            self._start(resume, overwrite)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, resume: bool, overwrite: bool) -> None:
        """Claim the output folder, then build the model fresh or from this run's newest checkpoint."""
        cfg = self.cfg
        for p in clean_temp_files(self.out_dir):
            print(f"removed {p} (left by a killed writer)", file=sys.stderr)
        claim_out_dir(self.out_dir, self.identity, resume=resume, overwrite=overwrite)
        seed_everything(cfg["seed"])
        ckpt = load_latest_checkpoint(self.out_dir, self.run_id, quarantine=True) if resume else None
        if resume and ckpt is None:
            print(f"no checkpoint in {self.out_dir / 'checkpoints'}: starting from scratch", file=sys.stderr)
        if ckpt is not None and int(ckpt["step"]) > cfg["train"]["iterations"]:
            raise RunStateError(f"{ckpt['path']}: checkpoint is at step {ckpt['step']}, beyond "
                                f"train.iterations={cfg['train']['iterations']}")
        if ckpt is not None:
            self.model = GaussianModel(ckpt["params"], ckpt["sh_degree"])
        else:
            self.model = self._init_model()
        self.model.to(self.device)
        self.optimizers = make_optimizers(self.model, cfg["train"]["lr"], self.scene_radius)
        # train.appearance=affine: per-train-image colour correction, own Adam (splat/appearance.py)
        self.appearance = make_appearance(cfg["train"], len(self.scene.train), self.device)
        if self.appearance is not None:
            self.optimizers["appearance"] = make_optimizer(self.appearance, cfg["train"]["appearance_lr"])
        self.strategy = make_strategy(cfg["strategy"], self.scene_radius)
        if ckpt is not None:
            if self.appearance is not None:
                self.appearance.load_state_dict(ckpt["appearance"])
            for name, opt in self.optimizers.items():
                opt.load_state_dict(ckpt["optimizers"][name])
            self.strategy.load_state_dict(ckpt["strategy"])
            set_rng_state(ckpt["rng"])
            self.step = int(ckpt["step"])
            self.train_seconds = float(ckpt.get("train_seconds", 0.0))
            print(f"resumed from {ckpt['path']} at step {self.step}", file=sys.stderr)

    def close(self) -> None:
        """Release the output folder (``train()`` does this when it ends)."""
        self._lock.release()

    # ------------------------------------------------------------ init
    def _init_model(self) -> GaussianModel:
        """Surfels on the start :func:`splat.data.initial_points.initial_points`
        picks for ``model.init`` (``auto``: the scene's or triangulated
        points, filled where they leave the views uncovered by stereo, then
        random points), sized by the 3DGS neighbour rule bounded by a few
        pixels at the point's depth.  Prints what it combined."""
        from .data.initial_points import initial_points

        mcfg = self.cfg["model"]
        start = initial_points(self.scene, mcfg["init"], num_stereo=mcfg["init_num_stereo"],
                               num_random=mcfg["init_num_random"], random_min_views=mcfg["init_random_min_views"],
                               fill_spacing=mcfg["init_fill_spacing"],
                               cache_dir=self.cfg["data"]["cache_dir"] or None, scene_name=self.cfg["data"]["path"],
                               background=self.background)
        print(f"init: {start.description}", file=sys.stderr)
        return create_from_points(start.points, start.colors, mcfg["sh_degree"], mcfg["init_opacity"],
                                  mcfg["init_scale"], max_scales=start.max_scales, primitive=mcfg["primitive"])

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

    def loss(self, out, gt: torch.Tensor, frame, step: int):
        """(loss, logging terms) of one step's render ``out`` against ``gt`` [H, W, 3].

        With ``frame.loss_mask`` (``data.masks=ignore``) render and target are
        both multiplied by it, so masked-out pixels add nothing to the
        photometric loss and get no gradient from it (the geometry
        regularisers still see every pixel)."""
        if frame.loss_mask is not None:
            m = frame.loss_mask.to(self.device)[..., None]  # [H, W, 1]
            out = dataclasses.replace(out, rgb=out.rgb * m)
            gt = gt * m
        K = frame.K.to(self.device)
        viewmat = frame.viewmat.to(self.device)
        return total_loss(out, gt, K, viewmat, step, self.cfg["loss"])

    def optimizer_step(self) -> None:
        """Apply and clear the gradients of every parameter."""
        for opt in self.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)

    def train_step(self, step: int) -> dict:
        """One optimisation step (1-based ``step``) over ``train.batch_size``
        cameras B: views ``(step - 1) B + 1 ... step B`` of the seeded view
        order (:func:`view_index`; B = 1 is one view per step).  The loss is
        the mean of the cameras' losses; each camera's backward runs before
        the next one renders, so memory is that of one camera.  Returns
        logging terms, averaged over the cameras."""
        cfg = self.cfg
        iterations = cfg["train"]["iterations"]
        batch = int(cfg["train"]["batch_size"])
        frames = self.scene.train
        lr = cfg["train"]["lr"]
        for g in self.optimizers["means"].param_groups:
            g["lr"] = means_lr(step, iterations, lr["means"], lr["means_final"]) * self.scene_radius

        outs, terms = [], {}
        for b in range(batch):
            index = view_index(cfg["seed"], (step - 1) * batch + b + 1, len(frames))
            out, loss, camera_terms = self._camera_loss(frames[index], index, step)
            self.strategy.step_pre_backward(self.model, self.optimizers, out, step)
            (loss / batch).backward()
            outs.append(out)
            for k, v in camera_terms.items():
                terms[k] = terms.get(k, 0.0) + v / batch
        self.optimizer_step()
        self.strategy.step_post_backward(self.model, self.optimizers, outs[0] if batch == 1 else outs, step)
        return terms

    def _camera_loss(self, frame, index: int, step: int):
        """(render, loss, logging terms) of one training camera ``frame``
        (``index`` in the training views)."""
        cfg = self.cfg
        bg = self.background
        if cfg["data"]["random_background"] and frame.mask is not None:
            bg = torch.rand(3)
        gt = gt_image(frame, bg, self.background).to(self.device)
        out = self.render(frame, bg, self.sh_degree_at(step))
        if self.appearance is not None:
            # With a mask the loader painted the background into the target, so
            # the photo's exposure applies to the scene only; without one every
            # pixel is photographed content (an uncovered one too).
            covered = (out.alpha, bg) if frame.mask is not None else ()
            out = dataclasses.replace(out, rgb=self.appearance(out.rgb, index, *covered))
        loss, terms = self.loss(out, gt, frame, step)
        terms["loss"] = float(loss.detach())
        terms["psnr"] = psnr(out.rgb, gt)
        return out, loss, terms

    def train(self) -> dict:
        """Run (or continue) training to ``train.iterations``; write outputs;
        return metrics; release the output folder."""
        try:
            return self._train()
        finally:
            self.close()

    def _train(self) -> dict:
        cfg = self.cfg
        iterations = int(cfg["train"]["iterations"])
        save_config(cfg, self.out_dir / "config.yaml")
        every = int(cfg["checkpoint"]["every"])
        bar = None
        if use_progress_bar(cfg["log"]["progress"]):
            from tqdm import tqdm

            bar = tqdm(total=iterations, initial=self.step, desc="train", dynamic_ncols=True, smoothing=0.1)
        log = LogLines(self.step, iterations, cfg["log"]["interval_s"])
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
            else:
                log.step(step, ema["loss"], self.model.num_gaussians)
            if (every > 0 and step % every == 0) or step == iterations:
                self.train_seconds += time.perf_counter() - t0
                t0 = time.perf_counter()
                self.save_checkpoint()
            if self.callbacks:
                t_hooks = time.perf_counter()
                for callback in self.callbacks:
                    callback(self, step, terms)
                t0 += time.perf_counter() - t_hooks  # a paused viewer is not training time
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
            "appearance": None if self.appearance is None else {
                k: v.detach().cpu() for k, v in self.appearance.state_dict().items()},
            "rng": rng_state(),
            "train_seconds": self.train_seconds,
            "config": self.cfg,
            "run_id": self.run_id,
        }
        path = checkpoint_path(self.out_dir, self.step, self.run_id)
        atomic_write(path, lambda f: torch.save(state, f))
        prune_checkpoints(self.out_dir, self.run_id, self.step, self.cfg["checkpoint"]["keep"])
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
        for k in ("psnr", "ssim", "psnr_masked", "ssim_masked", "depth_rel_err", "normal_deg_err"):
            if f"test.{k}" in m and m[f"test.{k}"] is not None:
                parts.append(f"test {k} {m[f'test.{k}']:.4g}")
        parts.append(f"peak mem {m['peak_memory_mb']:.0f} MB")
        print("done: " + ", ".join(parts) + f" -> {self.out_dir}", file=sys.stderr)


def train(cfg: Dict, out_dir, resume: bool = False, callbacks: Sequence[StepCallback] = ()) -> dict:
    """Convenience: ``Trainer(cfg, out_dir, resume, callbacks=callbacks).train()``."""
    return Trainer(cfg, out_dir, resume=resume, callbacks=callbacks).train()
