"""bench/error_regions.py: the four regions a test pixel falls in."""

from __future__ import annotations

import runpy
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
regions = runpy.run_path(str(ROOT / "bench" / "error_regions.py"))


def test_regions_split_every_pixel_once():
    """A depth step between columns 9 and 10 (20 % farther), no geometry in
    the last three columns, a photo with a sharp edge only at column 5:
    near_jumps holds the columns within 1 px of the step's two flagged
    columns and of the drop to no geometry (not the image border), textured the photo's edge,
    background the empty columns; the four masks partition the image."""
    H, W = 8, 20
    depth = torch.full((H, W), 2.0)
    depth[:, 10:] = 2.4
    depth[:, 17:] = 0.0
    image = torch.zeros(H, W, 3)
    image[:, 5:] = 1.0
    image[:, 6:] = 0.5  # a weaker edge, then flat
    view, gradient = regions["view_regions"](depth, image, max_bend=0.02, dilate=1)
    assert gradient.shape == (H, W)
    masks = regions["split_texture"](view, gradient, 0.9)
    total = sum(m.long() for m in masks.values())
    assert torch.equal(total, torch.ones(H, W, dtype=torch.long))  # each pixel in exactly one region
    assert bool(masks["near_jumps"][1:-1, 8:12].all()) and not bool(masks["near_jumps"][:, :8].any())
    assert bool(masks["near_jumps"][1:-1, 15:18].all())  # the drop to no geometry: a silhouette
    assert bool(masks["background"][:, 18:].all())
    textured_cols = masks["textured"].any(dim=0).nonzero().reshape(-1).tolist()
    assert set(textured_cols) <= {4, 5, 6} and textured_cols  # the strongest edge, not the flat parts
    assert bool(masks["smooth"][1:-1, 2].all())


def test_silhouettes_are_the_pixels_next_to_no_geometry():
    """A square of geometry in an empty image: with dilate 1 the square's
    outer ring (and the empty pixels around it) are silhouette pixels, its
    inside is not."""
    depth = torch.zeros(9, 9)
    depth[2:7, 2:7] = 3.0
    edge = regions["silhouettes"](depth, 1)
    assert bool(edge[2, 2:7].all()) and bool(edge[2:7, 6].all())
    assert not bool(edge[3:6, 3:6].any())
    assert bool(edge[0:2, :].all())  # no geometry at all: every such pixel is next to itself
