"""Shared helpers for the rasterizer tests."""

from __future__ import annotations

import torch

import splat

OUTPUTS = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")
PARAMS = ("means", "quats", "scales", "opacities", "colors")


def leaves(scene, dtype=None):
    """Copies of the differentiable inputs as leaves (optionally cast)."""
    out = {}
    for k in PARAMS + ("background",):
        if k in scene:
            t = scene[k] if dtype is None else scene[k].to(dtype)
            out[k] = t.detach().clone().requires_grad_(True)
    return out


def camera(scene, dtype=None):
    cast = (lambda t: t) if dtype is None else (lambda t: t.to(dtype))
    return dict(viewmat=cast(scene["viewmat"]), K=cast(scene["K"]), width=scene["width"], height=scene["height"])


def cotangents(out, seed=1):
    """Fixed random weights per output, so a loss touches every pixel and channel."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.rand(getattr(out, k).shape, generator=g, dtype=torch.float64).to(getattr(out, k).dtype) - 0.3
        for k in OUTPUTS
    }


def weighted_loss(out, weights, names=OUTPUTS):
    return sum((getattr(out, k) * weights[k]).sum() for k in names)


def render(params, cam, backend, **kw):
    return splat.rasterize(
        params["means"],
        params["quats"],
        params["scales"],
        params["opacities"],
        params["colors"],
        cam["viewmat"],
        cam["K"],
        cam["width"],
        cam["height"],
        background=params.get("background"),
        backend=backend,
        **kw,
    )


def all_grads(params, cam, backend, weights, names=OUTPUTS, **kw):
    """Outputs and d(weighted loss)/d(each input), means2d included."""
    out = render(params, cam, backend, **kw)
    loss = weighted_loss(out, weights, names)
    keys = list(params)
    grads = torch.autograd.grad(loss, [params[k] for k in keys] + [out.means2d], allow_unused=True)
    result = {k: (torch.zeros_like(params[k]) if g is None else g) for k, g in zip(keys, grads[:-1])}
    result["means2d"] = grads[-1]
    return out, result
