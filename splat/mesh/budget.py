"""How much memory a TSDF fusion will take, estimated before it starts, so
that a resolution the machine cannot hold is refused with one line instead
of dying inside an allocation.

* Bounded (:mod:`splat.mesh.tsdf`): open3d allocates a block of
  ``BLOCK_RESOLUTION^3`` voxels (tsdf, weight, colour: 5 float32) for each
  block that a measured pixel's truncation band touches.  The estimate
  back-projects every fused pixel, counts the distinct blocks they fall in,
  and allows for the band reaching into the neighbouring block along the ray
  (sdf_trunc is 5 voxels, under one 8-voxel block) and for open3d's hash map
  and the extracted mesh: :data:`BOUNDED_BLOCK_FACTOR` times the blocks' own
  bytes.
* Unbounded (:mod:`splat.mesh.unbounded`): a dense ``N^3`` grid of tsdf and
  weight (float32 each), the z-major copy handed to open3d and open3d's own
  copy: 16 bytes a sample.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..errors import SplatInputError
from .tsdf import BLOCK_RESOLUTION
from .views import FusionView

#: Bytes one fused voxel holds in open3d's block grid (5 float32 channels).
VOXEL_BYTES = 5 * 4
#: The band's second block along the ray, the hash map and the extraction.
BOUNDED_BLOCK_FACTOR = 4
#: float32 tsdf + weight, the transposed copy, open3d's copy.
UNBOUNDED_SAMPLE_BYTES = 16


def available_memory_bytes() -> Optional[int]:
    """Memory the kernel says a new allocation can get (``MemAvailable``), or
    None where that cannot be read (then nothing is refused)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def bounded_tsdf_bytes(views: Sequence[FusionView], voxel: float, depth_trunc: float) -> int:
    """Estimated peak bytes of :func:`splat.mesh.tsdf.fuse_tsdf` over ``views``
    at voxel edge ``voxel`` (module doc)."""
    block = float(voxel) * BLOCK_RESOLUTION
    keys = []
    for v in views:
        i, j = np.nonzero((v.depth > 0) & (v.depth <= depth_trunc))
        if len(i) == 0:
            continue
        z = v.depth[i, j].astype(np.float64)
        Kinv = np.linalg.inv(v.K)
        pix = np.stack([j + 0.5, i + 0.5, np.ones_like(z)], 0)  # [3, P] pixel centres
        cam = (Kinv @ pix) * z  # [3, P]
        R, t = v.viewmat[:3, :3], v.viewmat[:3, 3:]
        world = R.T @ (cam - t)  # [3, P]
        b = np.floor(world / block).astype(np.int64)
        # 21 bits a coordinate: distinct blocks stay distinct within +-1e6 blocks of the origin.
        packed = ((b[0] & 0x1FFFFF) << 42) | ((b[1] & 0x1FFFFF) << 21) | (b[2] & 0x1FFFFF)
        keys.append(np.unique(packed))
    blocks = len(np.unique(np.concatenate(keys))) if keys else 0
    return blocks * BLOCK_RESOLUTION**3 * VOXEL_BYTES * BOUNDED_BLOCK_FACTOR


def unbounded_tsdf_bytes(resolution: int) -> int:
    """Estimated peak bytes of :func:`splat.mesh.unbounded.extract_unbounded`."""
    return int(resolution) ** 3 * UNBOUNDED_SAMPLE_BYTES


def check_fits(needed: int, what: str, suggestion: str, available: Optional[int] = None) -> None:
    """Raises :class:`splat.errors.SplatInputError` with one line when
    ``needed`` bytes exceed the available memory; ``what`` names the setting,
    ``suggestion`` what would fit."""
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > available:
        raise SplatInputError(
            f"{what}: meshing needs about {_size(needed)}, more than the {_size(available)} available; {suggestion}"
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
