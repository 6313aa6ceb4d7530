"""A rank that dies must not leave the others hanging.

Each rank runs a :class:`Watchdog` thread that writes a heartbeat to the
rendezvous store (the key-value store torch.distributed already uses: the
torchrun agent's, or rank 0's with a plain ``env://`` start) every
``interval_s`` and reads the others'.  A rank is **lost** when

* it runs on this machine and its process is gone (seen at once), or
* its heartbeat has not moved for ``timeout_s`` (another machine, or a
  process that hangs), or
* it stopped on an error of its own (it says so in the store), or
* the store stops answering (whoever hosts it is gone).

The watchdog then prints one line naming the lost rank and ends this
process (``os._exit``), even when the main thread is blocked inside a
collective that would otherwise wait for ever (NCCL) or for the process
group's own timeout.  When a collective fails first (gloo notices a closed
connection at once), the trainer asks :meth:`Watchdog.lost_rank` which peer
went, so its error names it too.  A rank that ends normally says so in the
store and is never reported; one that stops because a peer was lost says
which (``stopped:<rank>``), so that in a cascade every rank names the rank
where it started rather than the neighbour it heard from.

Checkpoints are unaffected: one counts only once its manifest exists
(:mod:`splat.checkpoints`), so ``--resume`` continues from the
last complete one.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Optional

from ..errors import RankLostError  # noqa: F401 (raised by the trainer with lost_rank's words)
from .group import Group

#: Exit code of a rank that stops because a peer was lost.
EXIT_CODE = 75
_PREFIX = "splat/watchdog"
#: A rank's heartbeat value when it stops because of the lost rank that follows.
_STOPPED = "stopped:"


def _process_gone(pid: int) -> bool:
    """True when process ``pid`` on this machine has ended (or is a zombie
    its parent has not reaped yet, as torchrun's workers are for a moment)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False


class Watchdog:
    """Heartbeats between the ranks of ``group`` (see the module doc).
    ``timeout_s``: how long a silent peer on another machine is waited for."""

    def __init__(self, group: Group, timeout_s: float, interval_s: Optional[float] = None):
        import torch.distributed as dist

        self.group = group
        self.timeout_s = float(timeout_s)
        self.interval_s = float(interval_s) if interval_s else min(1.0, self.timeout_s / 10)
        self.store = dist.distributed_c10d._get_default_store()
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._lost: Optional[str] = None
        #: The rank behind ``_lost``: where a cascade of stopping ranks started.
        self._lost_origin: Optional[int] = None
        self._main_reporting = False  # the main thread will raise the error itself
        self._peers = {}  # rank -> (host, pid)
        self._seen = {}  # rank -> (last heartbeat value, time it last changed)
        self.store.set(f"{_PREFIX}/proc/{group.rank}", f"{self.host} {os.getpid()}")
        self._beat = 0
        self.store.set(f"{_PREFIX}/beat/{group.rank}", "0")
        self._thread = threading.Thread(target=self._run, name="splat-watchdog", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat += 1
                self.store.set(f"{_PREFIX}/beat/{self.group.rank}", str(self._beat))
                lost = self._check()
            except Exception as e:  # the store itself is gone
                if self._stop.is_set():
                    return
                lost = (
                    f"the rendezvous store stopped answering ({type(e).__name__}); it lives in "
                    f"{'torchrun' if os.environ.get('TORCHELASTIC_RUN_ID') else 'rank 0'}"
                )
            if lost is not None and not self._stop.is_set():
                self._lost = lost
                if not self._main_reporting:
                    self._exit(lost)
                return

    def _check(self) -> Optional[str]:
        """A description of the first lost peer, or None; its rank in
        ``_lost_origin``.  A peer that stopped because of another lost rank
        (``stopped:<rank>`` in the store) points at that rank: in a cascade
        every rank names where it started, not the neighbour it heard from."""
        now = time.monotonic()
        relayed = None  # (the rank that stopped, the rank it named)
        for r in range(self.group.world_size):
            if r == self.group.rank:
                continue
            beat_key = f"{_PREFIX}/beat/{r}"
            if not self.store.check([beat_key]):
                value = None  # not started yet: waited for like a silent one
            else:
                value = self.store.get(beat_key).decode()
            if value == "done":
                continue
            if value is not None and value.startswith(_STOPPED):
                relayed = relayed or (r, int(value[len(_STOPPED) :]))
                continue
            if value == "failed":
                self._lost_origin = r
                return f"rank {r} was lost: it stopped on an error (its own output says which)"
            if r not in self._peers and self.store.check([f"{_PREFIX}/proc/{r}"]):
                host, pid = self.store.get(f"{_PREFIX}/proc/{r}").decode().split()
                self._peers[r] = (host, int(pid))
            peer = self._peers.get(r)
            if peer is not None and peer[0] == self.host and _process_gone(peer[1]):
                self._lost_origin = r
                return f"rank {r} was lost: its process {peer[1]} on {peer[0]} ended"
            last = self._seen.get(r)
            if last is None or last[0] != value:
                self._seen[r] = (value, now)
            elif now - last[1] > self.timeout_s:
                where = f" on {peer[0]}" if peer else ""
                self._lost_origin = r
                return f"rank {r} was lost: no heartbeat{where} for {self.timeout_s:g} s (distributed.timeout_s)"
        if relayed is not None:
            stopped, origin = relayed
            self._lost_origin = origin
            return f"rank {origin} was lost (rank {stopped} stopped because of it; its own output says why)"
        return None

    def _exit(self, lost: str) -> None:
        self._mark_stopped()
        print(
            f"error: rank {self.group.rank} stopping: {lost}; restart with --resume to continue from the last "
            "complete checkpoint",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_CODE)

    def _mark_stopped(self) -> bool:
        """Tells the others this rank stops because of a lost peer (the one
        it found), so that they name that peer; False when it found none."""
        if self._lost_origin is None:
            return False
        self._set_beat(f"{_STOPPED}{self._lost_origin}")
        return True

    def _set_beat(self, value: str) -> None:
        try:
            self.store.set(f"{_PREFIX}/beat/{self.group.rank}", value)
        except Exception:  # the store's host is gone: nobody is left to tell
            pass

    # ------------------------------------------------------- the main thread
    def lost_rank(self, wait_s: Optional[float] = None) -> Optional[str]:
        """Which peer is lost, waiting up to ``wait_s`` (default: the
        timeout and two beats) for the thread to find out; None if none is."""
        self._main_reporting = True
        deadline = time.monotonic() + (self.timeout_s + 2 * self.interval_s if wait_s is None else wait_s)
        while time.monotonic() < deadline:
            if self._lost is not None:
                return self._lost
            try:
                found = self._check()
            except Exception:
                found = None
            if found is not None:
                return found
            time.sleep(min(self.interval_s, 0.1))
        return self._lost

    def close(self, ok: bool = True) -> None:
        """This rank ends: normally (``ok``: the others stop watching it), or
        on an error (the others stop too, naming it, instead of waiting in a
        collective this rank will never join)."""
        self._stop.set()
        # Joined, not left to die with the process: a thread inside a store
        # call while the store is destroyed aborts the process.
        self._thread.join(timeout=10.0)
        if ok:
            self._set_beat("done")
        elif not self._mark_stopped():
            self._set_beat("failed")
        self.store = None  # the process group owns the store: no reference may outlive it
