"""Which configs a run can train, and how it renders them.

Several processes shard the surfels and render each batch with
:func:`splat.distributed.render_sharded`, which exists for surfels drawn by
the C++/CUDA kernels only; everything else trains in one process, camera by
camera."""

from __future__ import annotations

from typing import Dict

from ..errors import ConfigError


def check_distributed(cfg: Dict) -> None:
    """A one-line ConfigError naming the key when ``cfg`` cannot train on several processes."""
    if cfg["model"]["primitive"] != "2dgs":
        raise ConfigError(
            f"model.primitive={cfg['model']['primitive']}: training on several processes "
            "renders surfels only (model.primitive=2dgs)"
        )
    if cfg["render"]["backend"] == "torch":
        raise ConfigError(
            "render.backend=torch: training on several processes needs the C++ or CUDA kernels (render.backend=auto)"
        )


def renders_sharded(primitive: str, backend: str) -> bool:
    """Whether steps and evaluation render with
    :func:`splat.distributed.render_sharded` (surfels with the C++/CUDA
    kernels, on any number of processes: one code path, so one process and
    N run the same arithmetic) rather than camera by camera with
    :func:`splat.model_render.render_frame` (3D Gaussians, the PyTorch
    reference backend)."""
    return primitive == "2dgs" and backend != "torch"
