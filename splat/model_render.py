"""A model rendered in one camera: :func:`render_frame` (training, evaluation,
the viewer, meshing) and :func:`normalized_normals`.

Which depth a run reports (``render.depth``) is explained in
:mod:`splat.render_files`; a batch of cameras whose surfels live on several
processes is rendered by :mod:`splat.distributed.sharded_render`.
"""

from __future__ import annotations

from typing import Optional

import torch

#: Set by tests/tools to substitute a rasterizer with the same signature.
RASTERIZE_OVERRIDE = None


def get_rasterize():
    """``splat.rasterize`` (imported lazily so this module loads without it)."""
    if RASTERIZE_OVERRIDE is not None:
        return RASTERIZE_OVERRIDE
    import splat

    fn = getattr(splat, "rasterize", None)
    if callable(fn):
        return fn
    from splat.rasterize import rasterize

    return rasterize


def render_frame(
    model,
    frame,
    background: Optional[torch.Tensor] = None,  # [3]
    sh_degree: Optional[int] = None,
    backend: str = "auto",
    near: float = 0.2,
    far: float = 100.0,
    device: Optional[torch.device] = None,
):
    """Rasterize ``model`` (a :class:`splat.model.GaussianModel`) in ``frame``'s camera,
    with :func:`splat.rasterize` or, for 3D Gaussians, :func:`splat.rasterize_3dgs`.

    ``sh_degree`` (default: the model's max) selects how many SH bands are used.
    Returns the rasterizer's output object (rgb, alpha, depth, median_depth,
    normal, distortion, radii, means2d).
    """
    d = model.sh_degree if sh_degree is None else min(int(sh_degree), model.sh_degree)
    dev = device if device is not None else model.means.device
    if model.primitive == "3dgs":
        from .rasterize_3dgs import rasterize_3dgs

        rasterize = rasterize_3dgs
    else:
        rasterize = get_rasterize()
    return rasterize(
        model.means,
        model.quats,
        model.scales,
        model.opacities,
        model.colors(d),  # [N, (d+1)^2, 3]
        frame.viewmat.to(dev),
        frame.K.to(dev),
        int(frame.width),
        int(frame.height),
        near=near,
        far=far,
        background=None if background is None else background.to(dev),
        sh_degree=d,
        backend=backend,
    )


def normalized_normals(normal: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Unit normals where alpha > 0, zero elsewhere. normal [H, W, 3], alpha [H, W]."""
    n = normal / normal.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.where((alpha > 0)[..., None], n, torch.zeros_like(n))
