"""Which training views a step renders: a seeded order, stateless, so a
resumed run needs no view-order state beyond ``seed``."""

from __future__ import annotations

import numpy as np


def view_index(seed: int, step: int, n_views: int) -> int:
    """Training view of 1-based ``step``: a fresh seeded permutation per epoch."""
    epoch, pos = divmod(step - 1, n_views)
    return int(np.random.default_rng([int(seed), int(epoch)]).permutation(n_views)[pos])


def batch_views(seed: int, step: int, batch_size: int, n_views: int) -> list[int]:
    """Indices into the training views of 1-based ``step``'s ``batch_size``
    cameras B: views ``(step - 1) B + 1 ... step B`` of the :func:`view_index`
    order, so a run sees each view equally often whatever B."""
    return [view_index(seed, (step - 1) * batch_size + b + 1, n_views) for b in range(batch_size)]
