"""The training loop: initialisation, optimisation, metrics.

Config: ``splat/config.py``; the output folder and atomic writes:
``splat/run_folder.py``; checkpoints: ``splat/checkpoints.py``; the
per-primitive state: ``splat/state.py``.

No argument parsing here (see ``train.py``).  Typical use::

    from splat.config import load_config
    from splat.trainer import Trainer
    cfg = load_config("configs/fast.yaml", ["train.iterations=2000"])
    metrics = Trainer(cfg, "output/run").train()

Output folder layout::

    OUT/config.yaml            resolved config (every field)
    OUT/checkpoints/ckpt_NNNNNNN.pt  atomic checkpoints (the newest ``checkpoint.keep``)
    OUT/point_cloud.ply        final model, INRIA attribute names (splat.ply.save_ply)
    OUT/metrics.json           test metrics, n_gaussians, iterations, train_seconds, peak_memory_mb
                               (test.psnr_masked / test.ssim_masked inside the object masks: eval.masked)

Determinism / resume: the initialisation draws from the global RNGs seeded
by ``seed`` (their state is saved in every checkpoint); the view order is a
pure function of ``(seed, epoch)``, and the split children and random
backgrounds are keyed by (seed, step, surfel id or camera)
(:mod:`splat.keyed_random`).  A run resumed from a checkpoint therefore
replays exactly the steps the uninterrupted run would have taken.

The loop is this class; each step is :class:`splat.training.step.BatchStep`
(one step over a batch of cameras, rendered camera by camera or sharded:
:mod:`splat.training.batch_rendering`), and the rules it follows live in
:mod:`splat.training` beside what they concern.

Several processes (``torchrun ... train.py``): the loop is the same; what
depends on ranks it asks :mod:`splat.distributed`.  Each rank holds a shard
of the surfels (with their Adam moments and densification statistics),
renders its cameras of the batch with
:func:`splat.distributed.render_sharded`, and writes its part of each
checkpoint; rank 0 prints, writes ``point_cloud.ply`` (the whole model) and
``metrics.json``.  The same config gives the same model on any number of
processes: bit for bit on the CPU, up to summation order on GPUs
(docs/distributed.md).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Sequence

import torch

from .checkpoints import checkpoint_state, load_latest_checkpoint, save_checkpoint, seed_everything, set_rng_state
from .config import check_config
from .data.background import resolve_background
from .devices import peak_memory_mb, resolve_device  # noqa: F401 (re-exported)
from .distributed import Group, from_environment, leave
from .distributed.collectives import all_counts
from .distributed.group import all_gather_objects, on_main
from .distributed.same_run import check_same_run, rank_identity
from .distributed.shard import rebalance
from .distributed.sharded_model import whole_model
from .errors import ConfigError, RunStateError, SplatInputError
from .evaluation import check_eval_masks, evaluate_frames
from .model import GaussianModel
from .model_render import render_frame
from .optimizers import make_optimizers  # noqa: F401 (re-exported)
from .ply import save_ply
from .progress import LogLines, format_duration, summary_line, use_progress_bar  # noqa: F401 (re-exported)
from .run_folder import (
    RunLock,
    atomic_write_bytes,
    check_out_dir,
    claim_out_dir,
    clean_temp_files,
    run_identity,
    save_config,
)
from .state import PrimitiveState
from .strategy import make_strategy
from .training.batch_rendering import camera_of, make_batch_rendering
from .training.capability import check_distributed
from .training.corrections import load_corrections, make_corrections, save_poses
from .training.initial_model import initial_shard
from .training.step import BatchStep, sh_degree_at
from .training.triage import explain

# ---------------------------------------------------------------- trainer
#: A per-step hook: ``callback(trainer, step, terms)`` runs after every
#: completed step (and its checkpoint, if one was due); ``terms`` are that
#: step's logging terms (loss, psnr, ...).  A callback may block to pause
#: training (e.g. a viewer's pause button) and may read ``trainer.model``.
StepCallback = Callable[["Trainer", int, dict], None]


class Trainer:
    """Owns the scene, model, optimisers and strategy of one run in ``out_dir``.

    ``callbacks``: :data:`StepCallback` hooks called after every step.
    ``group``: this process's :class:`splat.distributed.Group`; default: the
    one torchrun started it in (joined here, left by :meth:`close`), or one
    process."""

    def __init__(
        self,
        cfg: Dict,
        out_dir,
        resume: bool = False,
        scene=None,
        callbacks: Sequence[StepCallback] = (),
        overwrite: bool = False,
        group: Group | None = None,
    ):
        from .data import load_scene_from_config

        cfg = check_config(cfg)
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self._own_group = group is None
        self.group = group if group is not None else from_environment(cfg["device"], cfg["distributed"]["timeout_s"])
        self.watchdog = None
        self._lock = None
        try:
            self._setup(cfg, out_dir, resume, scene, overwrite, load_scene_from_config)
        except BaseException as e:
            error = explain(e, self.watchdog, self.group.rank)  # before close(): the watchdog names a lost peer
            self.close()
            if error is e:
                raise
            raise error from None

    def _setup(self, cfg, out_dir, resume, scene, overwrite, load_scene_from_config) -> None:
        if self.group.distributed:
            check_distributed(cfg)
            from .distributed.watchdog import Watchdog

            self.watchdog = Watchdog(self.group, cfg["distributed"]["timeout_s"])
        self.out_dir = check_out_dir(Path(out_dir))  # before the (slow) data loading
        self.device = self.group.device if self.group.distributed else resolve_device(cfg["device"])
        dcfg = cfg["data"]
        self.scene = (
            scene if scene is not None else load_scene_from_config(dcfg, eval_masks=cfg["eval"]["masked"] is not False)
        )
        # auto -> the colour, into this config: config.yaml, the run id and every later reader take it.
        dcfg["background"] = resolve_background(dcfg, self.scene, log=sys.stderr if self.group.is_main else None)
        self.background = torch.tensor(dcfg["background"], dtype=torch.float32).reshape(3)
        if not self.scene.train:
            raise SplatInputError(f"{dcfg['path']}: no training images")
        n_train, batch = len(self.scene.train), cfg["train"]["batch_size"]
        if batch > n_train:
            # More views per step than there are would render the same views
            # several times a step: slower for no gain, never what was meant.
            raise ConfigError(
                f"train.batch_size={batch} is more than the {n_train} training views of {dcfg['path']}; "
                f"use at most {n_train}"
            )
        check_eval_masks(cfg, self.scene)  # before the (long) training, not at its end
        self.scene_radius = float(self.scene.scene_radius())
        self.step = 0  # completed steps
        self._surfels_total = 0  # over all ranks as of the last step (progress lines)
        self._first_step = 0
        self.exchange_bytes = 0.0  # sent between ranks by this session's steps, all ranks together
        self.train_seconds = 0.0
        self.identity = run_identity(cfg, self.scene)
        # Before anything is written or trained: ranks with other code, config
        # or data would mix them into one model under several run ids.
        check_same_run(self.group, rank_identity(cfg, self.scene, self.identity["data_fingerprint"]))
        self.run_id = self.identity["run_id"]
        self._start(resume, overwrite)
        self.rendering = make_batch_rendering(self.model.primitive, cfg["render"], self.device, self.group)
        self.batch_step = BatchStep(
            cfg, self.scene, self.background, self.scene_radius, self.device, self.rendering, self.group, self.pose
        )

    def _claim(self, resume: bool, overwrite: bool) -> None:
        """Lock and claim the output folder (rank 0 only: the others share it)."""
        self._lock = RunLock(self.out_dir)
        for p in clean_temp_files(self.out_dir):
            print(f"removed {p} (left by a killed writer)", file=sys.stderr)
        claim_out_dir(self.out_dir, self.identity, resume=resume, overwrite=overwrite)

    def _start(self, resume: bool, overwrite: bool) -> None:
        """Claim the output folder, then build the model fresh or from this run's newest checkpoint."""
        cfg = self.cfg
        on_main(self.group, lambda: self._claim(resume, overwrite))
        seed_everything(cfg["seed"])
        ckpt = load_latest_checkpoint(self.out_dir, self.run_id, group=self.group, quarantine=True) if resume else None
        if resume and ckpt is None and self.group.is_main:
            print(f"no checkpoint in {self.out_dir / 'checkpoints'}: starting from scratch", file=sys.stderr)
        if ckpt is not None and int(ckpt["step"]) > cfg["train"]["iterations"]:
            raise RunStateError(
                f"{ckpt['path']}: checkpoint is at step {ckpt['step']}, beyond "
                f"train.iterations={cfg['train']['iterations']}"
            )
        if ckpt is not None:
            self.model = GaussianModel(
                ckpt["params"], ckpt["sh_degree"], ids=ckpt.get("ids"), next_id=ckpt.get("next_id")
            )
        else:
            self.model = initial_shard(cfg, self.scene, self.background, self.group)
        self.model.to(self.device)
        self.optimizers = make_optimizers(self.model, cfg["train"]["lr"], self.scene_radius)
        # train.appearance / train.pose_opt: per-train-image corrections, own Adams
        self.appearance, self.pose = make_corrections(cfg, self.scene, self.scene_radius, self.device, self.optimizers)
        self.strategy = make_strategy(cfg["strategy"], self.scene_radius, seed=cfg["seed"], group=self.group)
        # The one table of per-primitive state (parameters, moments, ids, statistics).
        self.state = PrimitiveState(self.model, self.optimizers)
        self.strategy.bind(self.state)
        if ckpt is not None:
            load_corrections(ckpt, self.appearance, self.pose)
            for name, opt in self.optimizers.items():
                opt.load_state_dict(ckpt["optimizers"][name])
            self.state.load_state_dict(ckpt)
            self.strategy.load_state_dict(ckpt["strategy"])
            set_rng_state(ckpt["rng"])
            self.step = int(ckpt["step"])
            self.train_seconds = float(ckpt.get("train_seconds", 0.0))
            if self.group.is_main:
                print(f"resumed from {ckpt['path']} at step {self.step}", file=sys.stderr)

    def close(self) -> None:
        """Release the output folder, and the process group if this trainer
        joined it (``train()`` does this when it ends)."""
        if self._lock is not None:
            self._lock.release()
        if self.watchdog is not None:  # still watching: this rank stops on an error
            self.watchdog.close(ok=False)
            self.watchdog = None
        if self._own_group and self.group.distributed:
            leave(self.group, synchronize=False)  # train() ended with a barrier; an error path must not wait
            self._own_group = False

    # ------------------------------------------------------------ loop
    def render(self, frame, background=None, sh_degree=None):
        """:func:`splat.model_render.render_frame` of this rank's model (default: ``data.background``)."""
        r = self.cfg["render"]
        bg = self.background if background is None else background
        return render_frame(
            self.model,
            frame,
            bg.to(self.device),
            sh_degree=sh_degree,
            backend=r["backend"],
            near=r["near"],
            far=r["far"],
            device=self.device,
        )

    def sh_degree_at(self, step: int) -> int:
        """SH degree used at ``step`` (:func:`splat.training.step.sh_degree_at`)."""
        return sh_degree_at(step, self.cfg["train"]["sh_increase_every"], self.model.sh_degree)

    def train_step(self, step: int) -> dict:
        """One optimisation step (:class:`splat.training.step.BatchStep`), the
        ids check and a rebalance of the shards when they drifted apart.
        Returns the logging terms, averaged over the batch's cameras."""
        cfg, group, model = self.cfg, self.group, self.model
        sums = self.batch_step(model, self.optimizers, self.strategy, self.appearance, step)
        self.state.check_ids(group.distributed)
        rebalance(self.state, group, cfg["distributed"]["max_imbalance"])
        terms, self._surfels_total, exchanged = sums.reduce(model.num_gaussians, group)
        self.exchange_bytes += exchanged
        return terms

    def train(self) -> dict:
        """Run (or continue) training to ``train.iterations``; write outputs;
        return metrics; release the output folder."""
        try:
            metrics = self._train()
            if self.watchdog is not None:
                # Every rank stops watching before any leaves: a rank whose
                # peers have gone would otherwise report them lost.
                import torch.distributed as dist

                self.watchdog.close(ok=True)
                self.watchdog = None
                dist.barrier()
            return metrics
        except BaseException as e:
            error = explain(e, self.watchdog, self.group.rank)
            if error is e:
                raise
            raise error from None
        finally:
            self.close()

    def _train(self) -> dict:
        cfg = self.cfg
        main = self.group.is_main
        iterations = int(cfg["train"]["iterations"])
        if main:
            save_config(cfg, self.out_dir / "config.yaml")
        every = int(cfg["checkpoint"]["every"])
        bar = None
        log = None
        if not main:
            pass  # progress and log lines come from rank 0 only
        elif use_progress_bar(cfg["log"]["progress"]):
            from tqdm import tqdm

            bar = tqdm(total=iterations, initial=self.step, desc="train", dynamic_ncols=True, smoothing=0.1)
        else:
            log = LogLines(self.step, iterations, cfg["log"]["interval_s"])
        t0 = time.perf_counter()
        ema = None
        self._first_step = self.step  # the exchange is counted from here (a resume starts a new count)
        while self.step < iterations:
            step = self.step + 1
            terms = self.train_step(step)
            self.step = step
            ema = terms if ema is None else {k: 0.9 * ema.get(k, v) + 0.1 * v for k, v in terms.items()}
            if bar is not None:
                bar.update(1)
                if step % cfg["log"]["every"] == 0 or step == iterations:
                    bar.set_postfix(loss=f"{ema['loss']:.4f}", psnr=f"{ema['psnr']:.2f}", n=self._surfels_total)
            elif log is not None:
                log.step(step, ema["loss"], self._surfels_total)
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
        whole = self.whole_model()
        if main:
            save_ply(whole, self.out_dir / "point_cloud.ply")
            save_poses(self.out_dir, self.pose, self.scene, cfg["data"]["path"])
        metrics = self.evaluate()
        if main:
            atomic_write_bytes(self.out_dir / "metrics.json", (json.dumps(metrics, indent=2) + "\n").encode())
            print(summary_line(self.step, metrics, self.out_dir), file=sys.stderr)
        return metrics

    def num_gaussians(self) -> int:
        """Surfels over all ranks (collective with several processes)."""
        return sum(all_counts(self.model.num_gaussians, self.group))

    def whole_model(self):
        """:func:`splat.distributed.sharded_model.whole_model` of this run (collective)."""
        return whole_model(self.model, self.group)

    # ------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Writes this step's checkpoint (several processes: this rank's shard,
        and the manifest from rank 0 once all are written) and deletes the
        ones beyond ``checkpoint.keep``."""
        state = checkpoint_state(
            self.step,
            self.state,
            self.optimizers,
            self.strategy,
            self.appearance,
            self.pose,
            self.train_seconds,
            self.cfg,
            self.run_id,
            self.group,
        )
        return save_checkpoint(self.out_dir, state, self.cfg["checkpoint"]["keep"], self.group)

    # ------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, frames=None) -> dict:
        """Test-set metrics (:func:`splat.evaluation.evaluate_frames`; the
        depth choice: :mod:`splat.render_files`).  Collective."""
        frames = self.scene.test if frames is None else frames
        metrics = {
            "n_gaussians": self.num_gaussians(),
            "iterations": self.step,
            "train_seconds": round(self.train_seconds, 3),
            "peak_memory_mb": round(peak_memory_mb(self.device), 1),
        }
        if self.group.distributed:
            metrics["processes"] = self.group.world_size
            metrics["peak_memory_mb_per_rank"] = all_gather_objects(metrics["peak_memory_mb"], self.group)
            steps = max(self.step - self._first_step, 1)
            metrics["exchange_mb_per_step"] = round(self.exchange_bytes / steps / 2**20, 3)
        test = evaluate_frames(
            self.cfg,
            self.background,
            frames,
            lambda views: self.rendering.render_views(
                self.model, [camera_of(f, self.background, self.device) for f in views], self.model.sh_degree
            ),
            self.group,
        )
        metrics.update({f"test.{k}": v for k, v in test.items()})
        metrics["test"] = test  # nested copy too: metrics["test"]["psnr"]
        return metrics


def train(cfg: Dict, out_dir, resume: bool = False, callbacks: Sequence[StepCallback] = ()) -> dict:
    """Convenience: ``Trainer(cfg, out_dir, resume, callbacks=callbacks).train()``."""
    return Trainer(cfg, out_dir, resume=resume, callbacks=callbacks).train()
