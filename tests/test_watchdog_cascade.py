"""The watchdog names where a cascade of stopping ranks started: a rank
that stops because a peer was lost tells the others which peer, so a third
rank does not blame the neighbour it heard from first.  Driven through a
key-value store in a dict (no processes: the decisions only)."""

from __future__ import annotations

import os

from splat.distributed.group import Group
from splat.distributed.watchdog import _PREFIX, Watchdog


class DictStore:
    def __init__(self, values=None):
        self.values = {k: v.encode() for k, v in (values or {}).items()}

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value


def watchdog(rank: int, world: int, store: DictStore) -> Watchdog:
    """A Watchdog's state without its thread or a process group."""
    w = Watchdog.__new__(Watchdog)
    w.group = Group(rank=rank, world_size=world)
    w.timeout_s, w.interval_s = 30.0, 1.0
    w.store, w.host = store, "here"
    w._lost, w._lost_origin, w._main_reporting = None, None, True
    w._peers, w._seen = {}, {}
    import threading

    w._stop = threading.Event()
    w._thread = threading.Thread(target=lambda: None)
    w._thread.start()
    return w


def beat(r: int) -> str:
    return f"{_PREFIX}/beat/{r}"


def test_a_rank_that_stops_for_a_lost_peer_names_that_peer_to_the_others():
    # Rank 2 died on an error; rank 1 saw it first and stops.
    store = DictStore({beat(0): "5", beat(1): "5", beat(2): "failed"})
    one = watchdog(1, 3, store)
    assert one._check().startswith("rank 2 was lost: it stopped on an error")
    one.close(ok=False)
    assert store.get(beat(1)) == b"stopped:2"
    # Rank 2's own note gone (its store key rewritten by a restart, or never
    # written after a kill -9): rank 0 still names rank 2, not rank 1.
    store.set(beat(2), "7")
    zero = watchdog(0, 3, store)
    assert zero._check() == "rank 2 was lost (rank 1 stopped because of it; its own output says why)"
    zero.close(ok=False)
    assert store.get(beat(0)) == b"stopped:2"


def test_a_direct_cause_is_named_before_a_relayed_one():
    store = DictStore({beat(0): "5", beat(1): "stopped:2", beat(2): "failed"})
    assert watchdog(0, 3, store)._check().startswith("rank 2 was lost: it stopped on an error")


def test_a_rank_killed_on_this_machine_is_named_after_its_relay():
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    store = DictStore(
        {
            beat(0): "5",
            beat(1): "stopped:2",
            beat(2): "9",
            f"{_PREFIX}/proc/2": f"here {dead}",
            f"{_PREFIX}/proc/1": f"here {os.getpid()}",
        }
    )
    assert watchdog(0, 3, store)._check() == f"rank 2 was lost: its process {dead} on here ended"


def test_a_rank_stopping_on_its_own_error_says_failed():
    store = DictStore({beat(0): "5", beat(1): "5"})
    w = watchdog(1, 2, store)
    assert w._check() is None
    w.close(ok=False)
    assert store.get(beat(1)) == b"failed"
