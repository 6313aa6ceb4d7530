"""One test view as a strip: ground truth | render | depth | normals.

::

    python render.py --model OUT --split test
    python scripts/test_view_figure.py --model OUT --view 0 --width 240 --out docs/dtu_scan24_test_view.jpg

Reads what ``render.py`` wrote under ``OUT/renders/test/`` (``rgb/*.png``,
``depth/*.npy`` camera z, ``normal/*.npy`` world normals, ``alpha/*.npy``)
and the ground-truth image of the same view from the scene.  Depth is shown
with OpenCV's TURBO colour map over the 1st-99th percentile of the covered
pixels' depths (near = red); normals as (n + 1) / 2 in RGB; pixels with
alpha < 0.5 are black in both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splat.config import load_config  # noqa: E402
from splat.data import load_scene_from_config  # noqa: E402


def ground_truth_bgr(frame) -> np.ndarray:
    """A frame's image as 8-bit BGR (OpenCV's order).  [H, W, 3]"""
    return (frame.image.numpy()[..., ::-1] * 255).clip(0, 255).astype(np.uint8)


def write_strip(images, frame, width: int, out) -> Path:
    """Panels of ``frame``'s size side by side, each ``width`` wide, into ``out``."""
    h = round(width * frame.height / frame.width)
    panels = [cv2.resize(p, (width, h), interpolation=cv2.INTER_AREA) for p in images]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    params = [cv2.IMWRITE_JPEG_QUALITY, 90] if out.suffix.lower() in (".jpg", ".jpeg") else []
    cv2.imwrite(str(out), np.concatenate(panels, axis=1), params)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="training output folder (holds config.yaml and renders/test)")
    ap.add_argument("--view", type=int, default=0, help="index of the test view")
    ap.add_argument("--width", type=int, default=240, help="width of each panel in pixels")
    ap.add_argument("--out", required=True, help="output image (.jpg or .png)")
    args = ap.parse_args(argv)

    model = Path(args.model)
    cfg = load_config(model / "config.yaml", [])
    scene = load_scene_from_config(cfg["data"])
    frame = scene.test[args.view]
    renders = model / "renders" / "test"
    stem = frame.stem
    rgb = cv2.imread(str(renders / "rgb" / f"{stem}.png"), cv2.IMREAD_COLOR)
    if rgb is None:
        raise SystemExit(f"--model: no render {renders / 'rgb' / (stem + '.png')}; run render.py --split test first")
    depth = np.load(renders / "depth" / f"{stem}.npy")
    normal = np.load(renders / "normal" / f"{stem}.npy")
    alpha = np.load(renders / "alpha" / f"{stem}.npy")
    covered = alpha >= 0.5

    lo, hi = np.percentile(depth[covered], [1, 99]) if covered.any() else (0.0, 1.0)
    d = 1 - np.clip((depth - lo) / max(hi - lo, 1e-9), 0, 1)  # near = 1 = red in TURBO
    depth_img = cv2.applyColorMap((d * 255).astype(np.uint8), cv2.COLORMAP_TURBO)
    normal_img = (((normal + 1) / 2)[..., ::-1] * 255).clip(0, 255).astype(np.uint8)
    depth_img[~covered] = 0
    normal_img[~covered] = 0

    print(write_strip([ground_truth_bgr(frame), rgb, depth_img, normal_img], frame, args.width, args.out))


if __name__ == "__main__":
    main()
