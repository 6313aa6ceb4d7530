"""``train.batch_size``: B cameras per step, the loss their mean (issue 23's
batches, in one process).

The tiny scene of tests/test_train.py; every check runs a step or two."""

from __future__ import annotations

import pytest
import torch
from test_train import tiny_config, tiny_scene  # noqa: F401 (fixture)

from splat.trainer import Trainer
from splat.training.step import camera_loss
from splat.training.views import view_index

#: The loss terms all switched on from step 1, so every gradient path is in the batch.
ALL_TERMS = ["loss.dist_from=0", "loss.normal_from=0"]


def _grads_of_one_step(trainer: Trainer, step: int = 1) -> dict:
    """The parameter gradients ``train_step(step)`` applies (the optimiser does not step)."""
    seen = {}

    def capture():
        for name, p in trainer.model.params.items():
            seen[name] = p.grad.detach().clone()
            p.grad = None

    trainer.batch_step.apply_gradients = lambda optimizers: capture()
    trainer.train_step(step)
    return seen


def test_the_batch_gradient_is_the_mean_over_its_cameras(tiny_scene, tmp_path):  # noqa: F811
    """One step of B = 3 against the three cameras' gradients taken one by
    one and averaged.  Float32 either way, summed in a different order:
    agreement to 1e-5 of each gradient's largest entry (observed up to 4e-7;
    a wrong 1/B or a camera left out is off by 30 % or more)."""
    step = 31  # SH degree 1 from step 31 (TINY_OVERRIDES): the shN gradient too
    batched = Trainer(tiny_config(tiny_scene, 100, ALL_TERMS + ["train.batch_size=3"]), tmp_path / "b3")
    grads = _grads_of_one_step(batched, step)

    single = Trainer(tiny_config(tiny_scene, 100, ALL_TERMS), tmp_path / "b1")
    frames = single.scene.train
    expect = {name: torch.zeros_like(p) for name, p in single.model.params.items()}
    for k in range(3 * (step - 1) + 1, 3 * step + 1):  # the batch's views in the seeded order
        index = view_index(single.cfg["seed"], k, len(frames))
        out = single.render(frames[index], single.background, single.sh_degree_at(step))
        loss, _ = camera_loss(out, frames[index].image, frames[index], step, single.cfg["loss"], single.device)
        loss.backward()
        for name, p in single.model.params.items():
            expect[name] += p.grad / 3
            p.grad = None
    for name, g in expect.items():
        scale = float(g.abs().max())
        assert scale > 0, name  # every parameter is reached by the loss
        assert torch.allclose(grads[name], g, rtol=0, atol=1e-5 * scale), (name, (grads[name] - g).abs().max())


def test_steps_take_the_next_views_of_the_seeded_order(tiny_scene, tmp_path):  # noqa: F811
    """Step s of batch B renders views (s-1)B+1 .. sB of the order B = 1 walks, so
    a run sees each view equally often whatever B, and resuming needs no state."""
    trainer = Trainer(tiny_config(tiny_scene, 10, ["train.batch_size=2"]), tmp_path / "run")
    rendered = []
    backward = trainer.rendering.backward

    def record(model, cameras, *args):
        for camera in cameras:
            rendered.append(
                next(i for i, f in enumerate(trainer.scene.train) if torch.equal(f.viewmat, camera.viewmat))
            )
        return backward(model, cameras, *args)

    trainer.rendering.backward = record
    for step in (1, 2, 3):
        terms = trainer.train_step(step)
    n = len(trainer.scene.train)
    assert rendered == [view_index(trainer.cfg["seed"], k, n) for k in range(1, 7)]
    assert {"loss", "psnr"} <= set(terms)


def test_densification_statistics_do_not_depend_on_the_batch_size(tiny_scene, tmp_path):  # noqa: F811
    """A batch of two copies of one camera has the loss of that camera alone:
    the accumulated screen-space gradient per view must be the same as with
    B = 1 (gsplat's convention: the batch mean's 1/B is undone), and each
    copy counts as a view."""
    stats = {}
    for batch in (1, 2):
        trainer = Trainer(tiny_config(tiny_scene, 10, [f"train.batch_size={batch}"]), tmp_path / f"b{batch}")
        frame = trainer.scene.train[0]
        trainer.scene.train = [frame] * batch  # every view of the step is that camera
        trainer.train_step(1)
        s = trainer.strategy
        stats[batch] = (s.grad2d.clone(), s.count.clone())
    (g1, c1), (g2, c2) = stats[1], stats[2]
    assert (c1 > 0).any() and torch.equal(c2, 2 * c1)
    # x 1/2 and x 2 are exact in binary floating point: equal, not close
    assert torch.equal(g2 / c2.clamp_min(1), g1 / c1.clamp_min(1))


def test_a_batch_larger_than_the_training_views_is_refused_with_one_line(tiny_scene, tmp_path):  # noqa: F811
    """B above the number of training views would render each view several
    times a step: refused at start, naming the key and the number of views."""
    from splat.data import load_scene_from_config
    from splat.errors import ConfigError

    cfg = tiny_config(tiny_scene, 10)
    n = len(load_scene_from_config(cfg["data"]).train)
    Trainer(tiny_config(tiny_scene, 10, [f"train.batch_size={n}"]), tmp_path / "all")  # every view: fine
    with pytest.raises(ConfigError, match=rf"train.batch_size={n + 1} is more than the {n} training views") as info:
        Trainer(tiny_config(tiny_scene, 10, [f"train.batch_size={n + 1}"]), tmp_path / "more")
    assert "\n" not in str(info.value)
