"""Training on several processes and machines with torch.distributed.

* :mod:`.group`: which process this is (torchrun's environment), the
  process group (NCCL between GPUs, gloo on CPUs), one process without
  torchrun;
* :mod:`.collectives`: small collectives (counts, sums, gathers of rows);
* :mod:`.exchange`: rows sent between ranks inside the autograd graph;
* :mod:`.sharded_render`: a batch of cameras rendered from surfels that live on
  different ranks, with exact gradients back to their owners;
* :mod:`.shard`: which rank holds which surfels, and moving them (balance);
* :mod:`.sharded_model`: a model spread over ranks (dealt out, rendered,
  gathered);
* :mod:`.watchdog`: a rank that dies stops the others, naming it;
* :mod:`.same_run`: every rank runs the same code, config and data;
* :mod:`.local`: N local processes as torchrun starts them (tests, benchmarks).

Checkpoints (one shard per rank and a manifest; resume on any number of
processes) are :mod:`splat.checkpoints`'.  The trainer (:mod:`splat.trainer`)
asks these modules whatever depends on ranks; docs/distributed.md is the
user's guide.
"""

from .exchange import exchange_counts, exchange_rows
from .group import Group, from_environment, launched_ranks, leave
from .sharded_render import Camera, ShardedRender, camera_rank, render_sharded

__all__ = [
    "Group",
    "from_environment",
    "launched_ranks",
    "leave",
    "exchange_counts",
    "exchange_rows",
    "Camera",
    "ShardedRender",
    "camera_rank",
    "render_sharded",
]
