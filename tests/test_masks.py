"""Training against masks: data.masks=ignore leaves masked-out pixels out of
the photometric loss; data.masks=background trains them to the background."""

from __future__ import annotations

import torch

import fixtures_data as fx
from test_train import tiny_config
from test_transforms_json import write_transforms

from splat.trainer import Trainer


def _trainer(tmp_path, masks):
    truth = fx.make_scene(n_views=4, width=16, height=12)
    root = tmp_path / "scene"
    if not root.exists():
        write_transforms(root, truth, masks=True)  # left half kept
    cfg = tiny_config(root, 2, [f"data.masks={masks}", "data.test_every=0", "loss.dist_lambda=0",
                                "loss.normal_lambda=0"])
    return Trainer(cfg, tmp_path / f"out_{masks}")


def test_ignore_mask_leaves_pixels_out_of_the_loss(tmp_path):
    t = _trainer(tmp_path, "ignore")
    try:
        frame = t.scene.train[0]
        assert frame.loss_mask is not None
        out = t.render(frame)
        gt = frame.image.clone()
        changed = gt.clone()
        changed[:, 8:] = torch.rand(12, 8, 3)  # only masked-out pixels differ
        la, _ = t.loss(out, gt, frame, 1)
        lb, _ = t.loss(out, changed, frame, 1)
        assert float(la.detach()) == float(lb.detach())
        changed[:, :8] = torch.rand(12, 8, 3)  # a kept pixel differs: the loss sees it
        assert float(t.loss(out, changed, frame, 1)[0].detach()) != float(la.detach())
        # no gradient reaches the render's masked-out pixels
        rgb = out.rgb.detach().requires_grad_(True)
        import dataclasses

        loss, _ = t.loss(dataclasses.replace(out, rgb=rgb), gt, frame, 1)
        loss.backward()
        assert float(rgb.grad[:, 8:].abs().max()) == 0.0 and float(rgb.grad[:, :8].abs().max()) > 0
    finally:
        t.close()


def test_background_mask_composites_and_trains(tmp_path):
    t = _trainer(tmp_path, "background")
    try:
        f = t.scene.train[0]
        assert f.loss_mask is None and f.mask is not None
        assert torch.allclose(f.image[:, 8:], t.background.expand(12, 8, 3))
    finally:
        t.close()
    m = _trainer(tmp_path, "none")
    m.close()
    assert m.scene.train[0].mask is None
