"""An error of one rank explained by a peer that went away."""

from __future__ import annotations

from ..errors import RankLostError, SplatInputError


def explain(e: BaseException, watchdog, rank: int) -> BaseException:
    """``e``, or a :class:`RankLostError` naming the peer when a lost rank is
    behind it (``watchdog``: the run's
    :class:`splat.distributed.watchdog.Watchdog`, None with one process).

    A failed collective (gloo notices a closed connection at once) may wait
    for the watchdog to find which peer went, up to
    ``distributed.timeout_s``; any other error (torchrun's SIGTERM after a
    worker died, a local error) only for a peer gone on this machine, seen
    at once, so that the other ranks hear of this one's error soon."""
    if watchdog is None or isinstance(e, SplatInputError):
        return e
    import torch.distributed as dist

    failed_collective = isinstance(e, dist.DistError) or any(
        word in str(e) for word in ("Connection closed", "Connection reset", "Broken pipe", "gloo", "NCCL")
    )
    lost = watchdog.lost_rank(None if failed_collective else 1.0)
    if lost is None:
        return e
    return RankLostError(
        f"rank {rank} stopping: {lost}; restart with --resume to continue from the last complete checkpoint"
    )
