"""Masked test metrics (``eval.masked``, issue 24): PSNR and SSIM inside the
object masks, next to the unchanged whole-image figures.  Definitions:
:func:`splat.losses.masked_psnr` and :func:`splat.losses.masked_ssim`."""

from __future__ import annotations

import json
import math

import fixtures_data as fx
import numpy as np
import pytest
import torch
from test_cli_errors import _one_error_line, train_cli
from test_transforms_json import write_transforms

from splat.config import load_config
from splat.data import load_scene
from splat.errors import ConfigError
from splat.losses import masked_psnr, masked_ssim, psnr, ssim
from splat.trainer import Trainer

H, W = 12, 16  # write_transforms' masks keep the left half, columns 0..7


# ------------------------------------------------------------- the metrics
def _inside_outside():
    """gt 0.5 everywhere; pred off by 0.1 inside the mask (columns 0-2), by 0.3 outside."""
    gt = torch.full((4, 6, 3), 0.5, dtype=torch.float64)
    mask = torch.zeros(4, 6, dtype=torch.float64)
    mask[:, :3] = 1.0
    pred = gt + torch.where(mask[..., None] > 0, 0.1, 0.3)
    return pred, gt, mask


def test_masked_psnr_counts_only_the_pixels_inside_the_mask():
    pred, gt, mask = _inside_outside()
    assert masked_psnr(pred, gt, mask) == pytest.approx(20.0, abs=1e-6)  # MSE 0.1^2 = 0.01
    assert psnr(pred, gt) == pytest.approx(-10 * math.log10((0.01 + 0.09) / 2), abs=1e-6)  # 13.01 dB, unchanged
    # a soft mask weights each pixel: column 3 at 0.5 adds half of its 4 pixels' 0.09 error
    mask[:, 3] = 0.5
    expected = -10 * math.log10((12 * 0.01 + 0.5 * 4 * 0.09) / (12 + 0.5 * 4))
    assert masked_psnr(pred, gt, mask) == pytest.approx(expected, abs=1e-6)
    assert masked_psnr(pred, gt, torch.zeros(4, 6)) is None  # an empty mask has no figure


def test_masked_ssim_composites_both_images_over_the_background():
    """Outside the mask render and photo both become the background, so what
    lies there (the backdrop) reaches no masked pixel through the window."""
    g = torch.Generator().manual_seed(0)
    gt = torch.rand(H, W, 3, generator=g)
    mask = torch.zeros(H, W)
    mask[:, :8] = 1.0
    pred = gt.clone()
    pred[:, 8:] = torch.rand(H, 8, 3, generator=g)  # wrong only outside the mask
    bg = torch.tensor([1.0, 1.0, 1.0])
    assert masked_ssim(pred, gt, mask, bg) == pytest.approx(1.0, abs=1e-6)
    assert float(ssim(pred, gt)) < 0.8  # the whole image sees the error
    pred[:, :8] = (gt[:, :8] + 0.2).clamp(0, 1)  # now wrong inside too
    assert masked_ssim(pred, gt, mask, bg) < 0.99
    assert masked_ssim(pred, gt, torch.zeros(H, W), bg) is None


# ------------------------------------------------------------- the trainer
def _scene(tmp_path, masks: bool):
    root = tmp_path / ("masked" if masks else "plain")
    if not root.exists():
        write_transforms(root, fx.make_scene(n_views=4, width=W, height=H), masks=masks)
    return root


def _overrides(root, *extra):
    # view_00 is the test view; 2 steps from 50 random surfels: fast, and the render is far from the photo
    return [
        f"data.path={root}",
        "data.test_every=4",
        "train.iterations=2",
        "model.init=random",
        "model.init_num_random=50",
        "checkpoint.every=0",
        "loss.dist_lambda=0",
        "loss.normal_lambda=0",
        "log.progress=false",
        *extra,
    ]


def test_loader_reads_the_test_masks_only_for_the_evaluation(tmp_path):
    root = _scene(tmp_path, masks=True)
    plain = load_scene(root)
    scene = load_scene(root, eval_masks=True)
    assert [f.stem for f in scene.test] == ["view_00"]
    assert all(f.object_mask is None for f in plain.test + plain.train + scene.train)
    (f,) = scene.test
    assert torch.equal(f.object_mask, (torch.arange(W) < 8).float().expand(H, W))
    assert f.loss_mask is None and f.mask is None and torch.equal(f.image, plain.test[0].image)


def test_masked_metrics_in_metrics_json_and_the_log_line(tmp_path, capsys):
    root = _scene(tmp_path, masks=True)
    out = tmp_path / "out"
    t = Trainer(load_config(None, _overrides(root)), out)  # eval.masked: auto (the default)
    m = t.train()
    err = capsys.readouterr().err
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test.psnr_masked"] == m["test"]["psnr_masked"] and saved["test.num_views_masked"] == 1
    assert "test psnr_masked" in err and "test ssim_masked" in err

    # the figures by hand from the render: inside the mask only, and the whole image as before
    (f,) = t.scene.test
    with torch.no_grad():
        rgb = t.render(f).rgb.clamp(0, 1).cpu().double()
    err2 = ((rgb - f.image.double()) ** 2).numpy()
    assert m["test.psnr_masked"] == pytest.approx(-10 * np.log10(err2[:, :8].mean()), abs=1e-6)
    assert m["test.psnr"] == pytest.approx(-10 * np.log10(err2.mean()), abs=1e-4)
    assert abs(m["test.psnr_masked"] - m["test.psnr"]) > 0.05  # inside and outside errors differ here

    # the photo's pixels outside the mask change the whole-image figures only
    f.image[:, 8:] = 1.0 - f.image[:, 8:]
    again = t.evaluate()
    assert again["test.psnr"] != m["test.psnr"]
    assert again["test.psnr_masked"] == pytest.approx(m["test.psnr_masked"], abs=1e-9)
    assert again["test.ssim_masked"] == pytest.approx(m["test.ssim_masked"], abs=1e-6)
    # eval.masked=false: the same whole-image figures, no masked ones
    t.cfg["eval"]["masked"] = False
    off = t.evaluate()
    assert off["test.psnr"] == again["test.psnr"] and off["test.ssim"] == again["test.ssim"]
    assert not any("masked" in k for k in off["test"])


def test_no_masks_auto_skips_true_is_a_one_line_error(tmp_path, capsys):
    root = _scene(tmp_path, masks=False)
    m = Trainer(load_config(None, _overrides(root)), tmp_path / "auto").train()
    assert not any("masked" in k for k in m)  # auto: nothing to report, no error
    capsys.readouterr()

    with pytest.raises(ConfigError, match=r"eval\.masked=true: none of the 1 test view\(s\) has an object mask"):
        Trainer(load_config(None, _overrides(root, "eval.masked=true")), tmp_path / "api")
    # train.py: one line naming the key, before any training (nothing written)
    out = tmp_path / "cli"
    code = train_cli.main(["--data", str(root), "--out", str(out), *_overrides(root, "eval.masked=true")[1:]])
    assert code == 1
    _one_error_line(capsys.readouterr().err, "eval.masked=true", "mask_path", "eval.masked=auto")
    assert not any(out.iterdir())
