"""Training against masks: data.masks=ignore leaves masked-out pixels out of
the photometric loss; data.masks=background trains them to the background.
And how mask files are read: every encoding tools write (0/255, 0/1 labels,
16-bit, palette label maps, alpha) gives the same weights, and an empty mask
is refused (splat.data.types.read_mask)."""

from __future__ import annotations

import json
from pathlib import Path

import fixtures_data as fx
import numpy as np
import pytest
import torch
from PIL import Image
from test_train import tiny_config
from test_transforms_json import write_transforms

from splat.data import DataError, load_scene
from splat.data.types import read_mask
from splat.trainer import Trainer
from splat.training.step import camera_loss


def _trainer(tmp_path, masks):
    truth = fx.make_scene(n_views=4, width=16, height=12)
    root = tmp_path / "scene"
    if not root.exists():
        write_transforms(root, truth, masks=True)  # left half kept
    cfg = tiny_config(
        root, 2, [f"data.masks={masks}", "data.test_every=0", "loss.dist_lambda=0", "loss.normal_lambda=0"]
    )
    return Trainer(cfg, tmp_path / f"out_{masks}")


def _loss(t, out, gt, frame):
    """(loss, terms) of step 1 of ``t``'s run for the render ``out`` against ``gt``."""
    return camera_loss(out, gt, frame, 1, t.cfg["loss"], t.device)


def test_ignore_mask_leaves_pixels_out_of_the_loss(tmp_path):
    t = _trainer(tmp_path, "ignore")
    try:
        frame = t.scene.train[0]
        assert frame.loss_mask is not None
        out = t.render(frame)
        gt = frame.image.clone()
        changed = gt.clone()
        changed[:, 8:] = torch.rand(12, 8, 3)  # only masked-out pixels differ
        la, _ = _loss(t, out, gt, frame)
        lb, _ = _loss(t, out, changed, frame)
        assert float(la.detach()) == float(lb.detach())
        changed[:, :8] = torch.rand(12, 8, 3)  # a kept pixel differs: the loss sees it
        assert float(_loss(t, out, changed, frame)[0].detach()) != float(la.detach())
        # no gradient reaches the render's masked-out pixels
        rgb = out.rgb.detach().requires_grad_(True)
        import dataclasses

        loss, _ = _loss(t, dataclasses.replace(out, rgb=rgb), gt, frame)
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


# ---------------------------------------------------------------- mask encodings (issue 27)
# One mask, the left half kept, stored in every encoding tools write.  Each must
# read as exactly these weights (splat.data.types.read_mask; the rule is in the
# docstring of splat/data/transforms.py).

H, W = 12, 16
KEEP = np.zeros((H, W), bool)
KEEP[:, : W // 2] = True


def _palette(index: np.ndarray, palette: list) -> Image.Image:
    im = Image.fromarray(index.astype(np.uint8), "P")
    im.putpalette(palette)
    return im


def _save(im: Image.Image):
    return lambda path: im.save(path)


u8, u16 = KEEP.astype(np.uint8), KEEP.astype(np.uint16)
rgb_noise = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
two_objects = u8 * np.where(np.arange(H)[:, None] < H // 2, 1, 2)  # labels 1 (top) and 2 (bottom)
ENCODINGS = {
    "grey 0/255": (_save(Image.fromarray(u8 * 255)), "png"),
    "grey 0/1 labels": (_save(Image.fromarray(u8)), "png"),
    "bilevel (mode 1)": (_save(Image.fromarray(KEEP)), "png"),
    "16-bit 0/65535": (lambda p: fx.write_png(p, u16 * 65535), "png"),
    "16-bit 0/1 labels": (lambda p: fx.write_png(p, u16), "png"),
    "16-bit RGB": (lambda p: fx.write_png(p, np.repeat(u16[..., None] * 65535, 3, 2)), "png"),
    "grey 0/2 labels": (_save(Image.fromarray(u8 * 2)), "png"),
    "grey labels 1 and 2": (_save(Image.fromarray(two_objects.astype(np.uint8))), "png"),
    "grey 0/128": (_save(Image.fromarray(u8 * 128)), "png"),
    "16-bit 0/2 labels": (lambda p: fx.write_png(p, u16 * 2), "png"),
    "RGB 0/2 labels": (_save(Image.fromarray(np.repeat(u8[..., None] * 2, 3, 2))), "png"),
    "RGB white": (_save(Image.fromarray(np.repeat(u8[..., None] * 255, 3, 2))), "png"),
    "RGB red on black": (_save(Image.fromarray(np.stack([u8 * 255, 0 * u8, 0 * u8], 2))), "png"),
    "RGB 0/1 labels": (_save(Image.fromarray(np.repeat(u8[..., None], 3, 2))), "png"),
    "RGBA object in alpha over black": (
        _save(Image.fromarray(np.dstack([np.zeros((H, W, 3), np.uint8), u8 * 255]))),
        "png",
    ),
    "RGBA cut-out photo": (_save(Image.fromarray(np.dstack([rgb_noise, u8 * 255]))), "png"),
    "RGBA opaque white object": (
        _save(Image.fromarray(np.dstack([np.repeat(u8[..., None] * 255, 3, 2), np.full((H, W), 255, np.uint8)]))),
        "png",
    ),
    "grey+alpha 16-bit": (lambda p: fx.write_png(p, np.dstack([0 * u16, u16 * 65535])), "png"),
    "palette, index 1 red": (_save(_palette(u8, [0, 0, 0, 255, 0, 0])), "png"),
    "palette, labels 1 and 2": (_save(_palette(two_objects, [0, 0, 0, 128, 0, 0, 0, 128, 0])), "png"),
    "palette, grey ramp 0/1": (_save(_palette(u8, [v for i in range(256) for v in (i, i, i)])), "png"),
    "float TIFF": (_save(Image.fromarray(KEEP.astype(np.float32), "F")), "tif"),
}


def _scene_with_masks(root: Path, encode, ext: str, **camera) -> Path:
    truth = fx.make_scene(n_views=2, width=W, height=H)
    write_transforms(root, truth, **camera)
    meta = json.loads((root / "transforms.json").read_text())
    (root / "masks").mkdir()
    for fr in meta["frames"]:
        name = f"masks/{Path(fr['file_path']).stem}.{ext}"
        encode(root / name)
        fr["mask_path"] = name
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_every_mask_encoding_reads_as_the_same_weights(tmp_path, encoding):
    encode, ext = ENCODINGS[encoding]
    root = _scene_with_masks(tmp_path / "s", encode, ext)
    keep = torch.from_numpy(KEEP).float()
    ign = load_scene(root, test_every=0, masks="ignore").train[0]
    assert torch.equal(ign.loss_mask, keep)
    bg = load_scene(root, test_every=0, masks="background", background=(0.0, 1.0, 0.0)).train[0]
    assert torch.equal(bg.mask, keep)
    assert torch.allclose(bg.image[:, W // 2 :], torch.tensor([0.0, 1.0, 0.0]).expand(H, W // 2, 3))
    assert torch.equal(bg.image[:, : W // 2], ign.image[:, : W // 2])
    assert torch.equal(torch.from_numpy(read_mask(next((root / "masks").iterdir()))), keep)


def test_soft_masks_keep_their_weights(tmp_path):
    grey = np.tile(np.array([0, 64, 128, 255], np.uint8), (H, W // 4))
    Image.fromarray(grey).save(tmp_path / "soft8.png")
    np.testing.assert_array_equal(read_mask(tmp_path / "soft8.png"), grey.astype(np.float32) / np.float32(255))
    fx.write_png(tmp_path / "soft16.png", grey.astype(np.uint16) * 257)
    np.testing.assert_allclose(read_mask(tmp_path / "soft16.png"), grey / 255.0, atol=1e-7)
    alpha = np.dstack([np.full((H, W, 3), 255, np.uint8), grey])  # soft alpha over white
    Image.fromarray(alpha).save(tmp_path / "softa.png")
    np.testing.assert_allclose(read_mask(tmp_path / "softa.png"), grey / 255.0, atol=1e-7)


def test_soft_masks_below_white_keep_their_weights(tmp_path):
    """Many grey levels are a soft matte even when white never occurs (a
    label map holds 0 and a few values): read as alpha, not as labels."""
    grey = (np.arange(H * W) % 20 * 10).astype(np.uint8).reshape(H, W)  # 20 levels, top 190
    Image.fromarray(grey).save(tmp_path / "soft8.png")
    np.testing.assert_array_equal(read_mask(tmp_path / "soft8.png"), grey.astype(np.float32) / np.float32(255))
    no_zero = np.where(KEEP, 2, 1).astype(np.uint8)  # 1/2 everywhere: no background label, so weights
    Image.fromarray(no_zero).save(tmp_path / "nozero.png")
    np.testing.assert_array_equal(read_mask(tmp_path / "nozero.png"), no_zero.astype(np.float32) / np.float32(255))


def test_a_0_2_label_mask_keeps_the_object_in_masked_training_and_metrics(tmp_path):
    """A 0/2 label mask (label 2 = object) reads as 0/1: ``background`` keeps
    the object's pixels as they are and the masked SSIM of a prediction that
    is right only outside the object is far below 1."""
    from splat.losses import masked_ssim

    root = _scene_with_masks(tmp_path / "s", *ENCODINGS["grey 0/2 labels"])
    plain = load_scene(root, test_every=0, masks="none").train[0]
    bg = load_scene(root, test_every=0, masks="background", background=(0.0, 1.0, 0.0)).train[0]
    assert torch.equal(bg.image[:, : W // 2], plain.image[:, : W // 2])
    assert torch.equal(bg.object_mask, torch.from_numpy(KEEP).float())
    wrong_inside = torch.where(bg.object_mask[..., None] > 0, 1.0 - plain.image, plain.image)
    assert masked_ssim(wrong_inside, plain.image, bg.object_mask, torch.zeros(3)) < 0.9


EMPTY = {
    "all black": lambda p: Image.fromarray(np.zeros((H, W), np.uint8)).save(p),
    "all black RGB": lambda p: Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(p),
    "16-bit, never above 1/255": lambda p: fx.write_png(p, np.full((H, W), 200, np.uint16)),
    "fully transparent": lambda p: Image.fromarray(np.zeros((H, W, 4), np.uint8)).save(p),
    "palette, all index 0": lambda p: _palette(np.zeros((H, W)), [255, 255, 255]).save(p),
}


@pytest.mark.parametrize("case", list(EMPTY))
@pytest.mark.parametrize("masks", ["background", "ignore"])
def test_empty_mask_is_refused_naming_the_file(tmp_path, case, masks):
    root = _scene_with_masks(tmp_path / "s", EMPTY[case], "png")
    with pytest.raises(DataError, match=r"masks/view_0\d\.png: mask is empty"):
        load_scene(root, test_every=0, masks=masks)
    load_scene(root, test_every=0, masks="none")  # not read at all


@pytest.mark.parametrize("encoding", ["grey 0/1 labels", "palette, index 1 red", "RGBA object in alpha over black"])
def test_masks_of_distorted_cameras_are_read_by_the_same_rule(tmp_path, encoding):
    """The undistorter reads masks as plain grey images: it must be handed the
    decoded weights, so that every encoding undistorts to the same mask."""
    lens = dict(camera_model="OPENCV", k1=-0.05, k2=0.01)
    ref = _scene_with_masks(tmp_path / "ref", *ENCODINGS["grey 0/255"], **lens)
    enc = _scene_with_masks(tmp_path / "enc", *ENCODINGS[encoding], **lens)
    a = load_scene(ref, test_every=0, masks="ignore", cache_dir=tmp_path / "c").train[0].loss_mask
    b = load_scene(enc, test_every=0, masks="ignore", cache_dir=tmp_path / "c").train[0].loss_mask
    assert a.shape != (H, W)  # it was undistorted
    assert float(a.max()) == 1.0 and float(a.min()) == 0.0
    torch.testing.assert_close(b, a, atol=1.0 / 255, rtol=0)
