"""Training on several processes and machines with torch.distributed (issue 23).

* :mod:`.group`: which process this is (torchrun's environment), the
  process group (NCCL between GPUs, gloo on CPUs), one process without
  torchrun;
* :mod:`.exchange`: rows sent between ranks inside the autograd graph;
* :mod:`.render`: a batch of cameras rendered from surfels that live on
  different ranks, with exact gradients back to their owners.
"""
from .exchange import exchange_counts, exchange_rows
from .group import Group, from_environment, launched_ranks, leave
from .render import Camera, ShardedRender, camera_rank, render_sharded

__all__ = ["Group", "from_environment", "launched_ranks", "leave", "exchange_counts", "exchange_rows", "Camera",
           "ShardedRender", "camera_rank", "render_sharded"]
