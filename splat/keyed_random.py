"""Random numbers keyed by what they are for, not by how many were drawn before.

Training draws a few random numbers (the positions of split children, the
random backgrounds).  Drawn from a global generator, they would depend on the
order in which the draws happen: on how the surfels are spread over
processes, and on what ran before a resume.  Here each number is a
pure function of its key, so a surfel's split children are the same on one
process or N, and after any resume:

    value = hash(seed, stream, key..., index)   (splitmix64, 64-bit wrapping)

``stream`` names the use (:data:`SPLIT_STREAM`, :data:`BACKGROUND_STREAM`, ...),
so two uses never share numbers.  Uniforms take the top 53 bits of the hash;
normals come from two uniforms by the Box-Muller transform.
"""

from __future__ import annotations

import numpy as np
import torch

#: Stream of the split children's offsets (keys: step, surfel id).
SPLIT_STREAM = 1
#: Stream of the random training backgrounds (keys: step, camera of the batch).
BACKGROUND_STREAM = 2
#: Stream of MCMC's relocation and growth draws (keys: step, kind, draw).
MCMC_SAMPLE_STREAM = 3
#: Stream of MCMC's position noise (keys: step, primitive id).
MCMC_NOISE_STREAM = 4
#: Stream of the initial points kept under ``strategy.max_gaussians`` (keys: point index).
INIT_SUBSAMPLE_STREAM = 5

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijective mix of uint64 words (wrapping)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(seed: int, stream: int, keys: np.ndarray) -> np.ndarray:
    """One uint64 per row of ``keys`` [..., K] (int64), chained through
    splitmix64 from (seed, stream)."""
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(keys.shape[:-1], np.uint64(int(seed) & (2**64 - 1)), dtype=np.uint64))
        h = _splitmix64(h ^ np.uint64(stream))
        for k in range(keys.shape[-1]):
            h = _splitmix64(h ^ keys[..., k].astype(np.uint64))
    return h


def keyed_uniform(seed: int, stream: int, keys: torch.Tensor, count: int) -> torch.Tensor:
    """Uniforms in [0, 1): ``keys`` [M, K] int64 -> [M, count] float64; row m
    depends only on (seed, stream, keys[m])."""
    k = keys.detach().cpu().to(torch.int64).numpy()
    # The hash of (seed, stream, keys[m], index) chains through the key
    # columns, so the chain up to keys[m] is computed once per row.
    prefix = _hash(seed, stream, k)  # [M]
    with np.errstate(over="ignore"):
        bits = _splitmix64(prefix[..., None] ^ np.arange(count, dtype=np.uint64)) >> np.uint64(11)  # 53 bits
    return torch.from_numpy(bits.astype(np.float64) * (1.0 / 2**53))


def keyed_normal(seed: int, stream: int, keys: torch.Tensor, count: int) -> torch.Tensor:
    """Standard normals: ``keys`` [M, K] int64 -> [M, count] float64 (Box-Muller
    on two keyed uniforms each)."""
    u = keyed_uniform(seed, stream, keys, 2 * count).reshape(keys.shape[0], count, 2)
    radius = torch.sqrt(-2.0 * torch.log1p(-u[..., 0]))  # 1 - u in (0, 1]: finite
    return radius * torch.cos(2.0 * np.pi * u[..., 1])
