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
    OUT/point_cloud.ply        final model, INRIA attribute names (splat.ply.save_ply)
    OUT/metrics.json           test metrics, n_gaussians, iterations, train_seconds, peak_memory_mb
                               (test.psnr_masked / test.ssim_masked inside the object masks: eval.masked)

Determinism / resume: the initialisation draws from the global RNGs seeded
by ``seed`` (their state is saved in every checkpoint); the view order is a
pure function of ``(seed, epoch)``, and the split children and random
backgrounds are keyed by (seed, step, surfel id or camera)
(:mod:`splat.keyed_random`).  A run resumed from a checkpoint therefore
replays exactly the steps the uninterrupted run would have taken.

Several processes (``torchrun ... train.py``, issue 23): the loop is the
same; what depends on ranks it asks :mod:`splat.distributed`.  Each rank
holds a shard of the surfels (with their Adam moments and densification
statistics), renders its cameras of the batch with
:func:`splat.distributed.render_sharded`, and writes its part of each
checkpoint; rank 0 prints, writes ``point_cloud.ply`` (the whole model) and
``metrics.json``.  The same config gives the same model on any number of
processes: bit for bit on the CPU, up to summation order on GPUs
(docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
import json
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
    rng_state,
    run_identity,
    save_config,
    seed_everything,
    set_rng_state,
)
from .appearance import make_appearance, make_optimizer
from .config import check_config
from .distributed import Camera, Group, from_environment, leave
from .distributed.checkpoint import load_latest_checkpoint, prune as prune_checkpoints, save_sharded
from .distributed.group import all_gather_objects, on_main
from .distributed.model import render_model, shard_of, sum_replicated_gradients, whole_model
from .distributed.shard import all_counts, all_sum, rebalance
from .evaluation import check_eval_masks, evaluate_frames, evaluate_frames_batched
from .errors import ConfigError, RankLostError, RunStateError, SplatInputError
from .keyed_random import BACKGROUND_STREAM, keyed_uniform
from .losses import LOSS_TERMS, psnr, total_loss
from .model import GaussianModel, create_from_points
from .ply import save_ply
from .optimizers import make_optimizers, means_lr  # noqa: F401 (make_optimizers re-exported)
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

    ``callbacks``: :data:`StepCallback` hooks called after every step.
    ``group``: this process's :class:`splat.distributed.Group`; default: the
    one torchrun started it in (joined here, left by :meth:`close`), or one
    process."""

    def __init__(self, cfg: Dict, out_dir, resume: bool = False, scene=None,
                 callbacks: Sequence[StepCallback] = (), overwrite: bool = False, group: Group | None = None):
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
            error = self._explained(e)  # before close(): the watchdog names a lost peer
            self.close()
            if error is e:
                raise
            raise error from None

    def _setup(self, cfg, out_dir, resume, scene, overwrite, load_scene_from_config) -> None:
        if self.group.distributed:
            if cfg["model"]["primitive"] != "2dgs":
                raise ConfigError(f"model.primitive={cfg['model']['primitive']}: training on several processes "
                                  "renders surfels only (model.primitive=2dgs)")
            if cfg["render"]["backend"] == "torch":
                raise ConfigError("render.backend=torch: training on several processes needs the C++ or CUDA "
                                  "kernels (render.backend=auto)")
            from .distributed.watchdog import Watchdog

            self.watchdog = Watchdog(self.group, cfg["distributed"]["timeout_s"])
        self.out_dir = check_out_dir(Path(out_dir))  # before the (slow) data loading
        self.device = self.group.device if self.group.distributed else resolve_device(cfg["device"])
        dcfg = cfg["data"]
        self.background = torch.tensor(dcfg["background"], dtype=torch.float32).reshape(3)
        self.scene = scene if scene is not None else load_scene_from_config(
            dcfg, eval_masks=cfg["eval"]["masked"] is not False)
        if not self.scene.train:
            raise SplatInputError(f"{dcfg['path']}: no training images")
        check_eval_masks(cfg, self.scene)  # before the (long) training, not at its end
        self.scene_radius = float(self.scene.scene_radius())
        self.step = 0  # completed steps
        self._surfels_total = 0
        self._first_step = 0
        self.exchange_bytes = 0.0  # sent between ranks by this session's steps, all ranks together
        self.train_seconds = 0.0
        self.identity = run_identity(cfg, self.scene)
        self.run_id = self.identity["run_id"]
        self._start(resume, overwrite)

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
            raise RunStateError(f"{ckpt['path']}: checkpoint is at step {ckpt['step']}, beyond "
                                f"train.iterations={cfg['train']['iterations']}")
        if ckpt is not None:
            self.model = GaussianModel(ckpt["params"], ckpt["sh_degree"], ids=ckpt.get("ids"),
                                       next_id=ckpt.get("next_id"))
        else:
            self.model = self._initial_shard()
        self.model.to(self.device)
        self.optimizers = make_optimizers(self.model, cfg["train"]["lr"], self.scene_radius)
        # train.appearance=affine: per-train-image colour correction, own Adam (splat/appearance.py)
        self.appearance = make_appearance(cfg["train"], len(self.scene.train), self.device)
        if self.appearance is not None:
            self.optimizers["appearance"] = make_optimizer(self.appearance, cfg["train"]["appearance_lr"])
        self.strategy = make_strategy(cfg["strategy"], self.scene_radius, seed=cfg["seed"], group=self.group)
        if ckpt is not None:
            if self.appearance is not None:
                self.appearance.load_state_dict(ckpt["appearance"])
            for name, opt in self.optimizers.items():
                opt.load_state_dict(ckpt["optimizers"][name])
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

    def _explained(self, e: BaseException) -> BaseException:
        """``e``, or a :class:`RankLostError` naming the peer when a lost rank
        is behind it.  A failed collective (gloo notices a closed connection
        at once) may wait for the watchdog to find which peer went, up to
        ``distributed.timeout_s``; any other error (torchrun's SIGTERM after
        a worker died, a local error) only for a peer gone on this machine,
        seen at once, so that the other ranks hear of this one's error soon."""
        if self.watchdog is None or isinstance(e, SplatInputError):
            return e
        import torch.distributed as dist

        failed_collective = isinstance(e, dist.DistError) or any(
            word in str(e) for word in ("Connection closed", "Connection reset", "Broken pipe", "gloo", "NCCL"))
        lost = self.watchdog.lost_rank(None if failed_collective else 1.0)
        if lost is None:
            return e
        return RankLostError(f"rank {self.group.rank} stopping: {lost}; restart with --resume to continue from "
                             "the last complete checkpoint")

    # ------------------------------------------------------------ init
    def _initial_shard(self) -> GaussianModel:
        """The initial model (:meth:`_init_model`, built by rank 0 and sent to
        all), of which this rank keeps its balanced slice."""
        if not self.group.distributed:
            return self._init_model()
        params, sh_degree = on_main(self.group, lambda: (lambda m: (m.raw_state(), m.sh_degree))(self._init_model()))
        return shard_of(params, sh_degree, self.group)

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
        if self.group.is_main:
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

    @property
    def renders_sharded(self) -> bool:
        """Whether steps and evaluation render with
        :func:`splat.distributed.render_sharded` (surfels with the C++/CUDA
        kernels, on any number of processes: one code path, so one process
        and N run the same arithmetic) rather than camera by camera with
        :func:`splat.render.render_frame` (3D Gaussians, the PyTorch
        reference backend)."""
        return self.model.primitive == "2dgs" and self.cfg["render"]["backend"] != "torch"

    def train_step(self, step: int) -> dict:
        """One optimisation step; see :meth:`train_step_sharded` and
        :meth:`train_step_per_camera`."""
        if self.renders_sharded:
            return self.train_step_sharded(step)
        return self.train_step_per_camera(step)

    def _set_means_lr(self, step: int) -> None:
        lr = self.cfg["train"]["lr"]
        for g in self.optimizers["means"].param_groups:
            g["lr"] = means_lr(step, self.cfg["train"]["iterations"], lr["means"], lr["means_final"]) * self.scene_radius

    def _batch_views(self, step: int) -> list:
        """Indices into the training views of ``step``'s ``train.batch_size`` cameras."""
        batch = int(self.cfg["train"]["batch_size"])
        return [view_index(self.cfg["seed"], (step - 1) * batch + b + 1, len(self.scene.train)) for b in range(batch)]

    def _background(self, frame, step: int, slot: int) -> torch.Tensor:
        """The background of camera ``slot`` of ``step``: the configured one, or
        with ``data.random_background`` and a mask a random colour keyed by
        (seed, step, slot), the same on any number of processes."""
        if self.cfg["data"]["random_background"] and frame.mask is not None:
            key = torch.tensor([[step, slot]], dtype=torch.int64)
            return keyed_uniform(self.cfg["seed"], BACKGROUND_STREAM, key, 3)[0].float()
        return self.background

    def train_step_per_camera(self, step: int) -> dict:
        """One optimisation step (1-based ``step``) over ``train.batch_size``
        cameras B: views ``(step - 1) B + 1 ... step B`` of the seeded view
        order (:func:`view_index`; B = 1 is one view per step).  The loss is
        the mean of the cameras' losses; each camera's backward runs before
        the next one renders, so memory is that of one camera.  Returns
        logging terms, averaged over the cameras."""
        batch = int(self.cfg["train"]["batch_size"])
        frames = self.scene.train
        self._set_means_lr(step)
        outs, terms = [], {}
        for b, index in enumerate(self._batch_views(step)):
            out, loss, camera_terms = self._camera_loss(frames[index], index, step, b)
            self.strategy.step_pre_backward(self.model, self.optimizers, out, step)
            (loss / batch).backward()
            outs.append(out)
            for k, v in camera_terms.items():
                terms[k] = terms.get(k, 0.0) + v / batch
        self.optimizer_step()
        self.strategy.step_post_backward(self.model, self.optimizers, outs[0] if batch == 1 else outs, step)
        return terms

    def train_step_sharded(self, step: int) -> dict:
        """One step over ``train.batch_size`` cameras B rendered together from
        every rank's surfels (:func:`splat.distributed.render_sharded`: camera
        i on rank i mod N; one process renders them all).  The loss is the
        mean over the batch, and one backward carries each surfel's gradient
        back to its owner, summed over the cameras in the same order on any
        number of processes.  The appearance corrections, which every rank
        holds whole, have their gradients summed over the ranks.  Then
        densification, and a rebalance of the shards when they drifted
        apart.  Memory: the B cameras' renders at once."""
        from .strategy import Visibility

        cfg, group, model = self.cfg, self.group, self.model
        batch = int(cfg["train"]["batch_size"])
        frames = self.scene.train
        self._set_means_lr(step)
        views = self._batch_views(step)
        backgrounds = [self._background(frames[i], step, b) for b, i in enumerate(views)]
        cameras = [self._camera(frames[i], bg) for i, bg in zip(views, backgrounds)]
        r = render_model(model, cameras, group, self.sh_degree_at(step), cfg["render"]["near"], cfg["render"]["far"])
        loss_sum = r.anchor
        names = ("loss", "psnr") + LOSS_TERMS
        sums, present = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        for b, out in r.outputs.items():
            frame = frames[views[b]]
            out = self._corrected(out, views[b], frame, backgrounds[b])
            gt = gt_image(frame, backgrounds[b], self.background).to(self.device)
            loss, camera_terms = self.loss(out, gt, frame, step)
            loss_sum = loss_sum + loss / batch
            camera_terms.update(loss=float(loss.detach()), psnr=psnr(out.rgb, gt))
            for k, v in camera_terms.items():
                sums[k] += v
                present[k] += 1
        seen = [Visibility(r.means2d[b], r.radii[b], c.width, c.height) for b, c in enumerate(cameras)]
        for camera in seen:
            self.strategy.step_pre_backward(model, self.optimizers, camera, step)
        loss_sum.backward()
        if self.appearance is not None:
            sum_replicated_gradients(self.appearance, group, sparse=True)  # SparseAdam's row gradients
        self.optimizer_step()
        self.strategy.step_post_backward(model, self.optimizers, seen[0] if batch == 1 else seen, step)
        self._check_ids()
        rebalance(model, self.optimizers, self.strategy, group, cfg["distributed"]["max_imbalance"])
        # One reduction for the logging terms (over the cameras of every rank), the count and the exchange.
        total = all_sum([sums[k] for k in names] + [present[k] for k in names]
                        + [model.num_gaussians, r.bytes_sent + r.bytes_backward], group)
        self._surfels_total = int(total[-2])
        self.exchange_bytes += total[-1]
        return {k: total[j] / batch for j, k in enumerate(names) if total[len(names) + j] > 0}

    def _check_ids(self) -> None:
        """A strategy that edits rows without their ids (a custom one, through
        :func:`splat.strategy.update_params` alone) leaves them stale: one
        process numbers its rows afresh (their order is all a render needs
        there); several processes cannot, and stop with an error."""
        model = self.model
        if len(model.ids) == model.num_gaussians:
            return
        if self.group.distributed:
            raise RunStateError(f"strategy.name={self.cfg['strategy']['name']}: the strategy changed the number of "
                                "surfels without their ids (model.ids), which several processes need")
        model.ids = torch.arange(model.num_gaussians)
        model.next_id = model.num_gaussians

    def _camera(self, frame, background) -> Camera:
        return Camera(frame.viewmat.to(self.device), frame.K.to(self.device), int(frame.width), int(frame.height),
                      background.to(self.device))

    def _corrected(self, out, index: int, frame, background):
        """``out`` through the train view ``index``'s appearance correction, if any."""
        if self.appearance is None:
            return out
        # With a mask the loader painted the background into the target, so
        # the photo's exposure applies to the scene only; without one every
        # pixel is photographed content (an uncovered one too).
        covered = (out.alpha, background) if frame.mask is not None else ()
        return dataclasses.replace(out, rgb=self.appearance(out.rgb, index, *covered))

    def _camera_loss(self, frame, index: int, step: int, slot: int = 0):
        """(render, loss, logging terms) of one training camera ``frame``
        (``index`` in the training views, ``slot`` in the step's batch)."""
        bg = self._background(frame, step, slot)
        gt = gt_image(frame, bg, self.background).to(self.device)
        out = self._corrected(self.render(frame, bg, self.sh_degree_at(step)), index, frame, bg)
        loss, terms = self.loss(out, gt, frame, step)
        terms["loss"] = float(loss.detach())
        terms["psnr"] = psnr(out.rgb, gt)
        return out, loss, terms

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
            error = self._explained(e)
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
                    bar.set_postfix(loss=f"{ema['loss']:.4f}", psnr=f"{ema['psnr']:.2f}", n=self._surfels_seen)
            elif log is not None:
                log.step(step, ema["loss"], self._surfels_seen)
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
        metrics = self.evaluate()
        if main:
            atomic_write_bytes(self.out_dir / "metrics.json", (json.dumps(metrics, indent=2) + "\n").encode())
            self._print_summary(metrics)
        return metrics

    @property
    def _surfels_seen(self) -> int:
        """Surfels over all ranks as of the last step (for progress lines; not collective)."""
        return self._surfels_total if self.group.distributed else self.model.num_gaussians

    def num_gaussians(self) -> int:
        """Surfels over all ranks (collective with several processes)."""
        return sum(all_counts(self.model.num_gaussians, self.group))

    def whole_model(self):
        """:func:`splat.distributed.model.whole_model` of this run (collective)."""
        return whole_model(self.model, self.group)

    # ------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Writes this step's checkpoint (several processes: this rank's shard,
        and the manifest from rank 0 once all are written) and deletes the
        ones beyond ``checkpoint.keep``."""
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
            "ids": self.model.ids.clone(),
            "next_id": self.model.next_id,
            "rank": self.group.rank,
            "world_size": self.group.world_size,
        }
        if self.group.distributed:
            path = save_sharded(self.out_dir, state, self.group)
            if self.group.is_main:
                prune_checkpoints(self.out_dir, self.run_id, self.step, self.cfg["checkpoint"]["keep"])
            return path
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
        if self.renders_sharded:
            r = self.cfg["render"]
            test = evaluate_frames_batched(
                self.cfg, self.background, frames, lambda views: render_model(
                    self.model, [self._camera(f, self.background) for f in views], self.group,
                    self.model.sh_degree, r["near"], r["far"]).outputs, self.group)
        else:
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
