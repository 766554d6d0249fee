"""Where this worker process placed each recent prefix key, so a key's later requests find its cache,
and how many live keys each replica holds, so new keys spread by what the replicas cache, not by luck.

Rendezvous hashing alone spreads keys evenly only on average: 12 conversations over 2 replicas split
3/9 for one benchmark seed, and the replica holding 9 conversations evicted them from a KV cache sized
for about 7 (its hit rate fell from 88% to 65%, its TTFT p90 rose 2.4x). So a key this process has not
seen goes to its rendezvous choice while that one holds at most ``KEY_BALANCE`` times the average
number of live keys, else to the next within that bound: bounded-load consistent hashing applied to
keys, the balls and bins of Mirrokni, Thorup and Zadimoghaddam's paper. Placing a new key elsewhere
costs nothing (no replica caches it yet); once placed, a key stays where it went.

A key counts toward its replica while requests carry it: one unseen for ``LIVE_S`` (a conversation
that ended, or paused) no longer counts, as its cache entries are the first the engine evicts. Where it
went is remembered longer (``HOME_S``, at most ``MAX_KEYS`` keys), so its next turn still goes home.
Counting finished keys placed new ones by a past load: in the benchmark, the 12 conversations of one
pass still counted during the next, whose 12 then split 4/8. Worker processes keep their own maps; fed
the same keys they place them alike, and a key's rendezvous choice is where most of them put it.
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Callable, Sequence

from serving.llm.routing.policies.base import Replica
from serving.llm.routing.policies.hashing import rendezvous, within

KEY_BALANCE = 1.1   # a replica may home 10% more live keys than the average before new keys go elsewhere
LIVE_S = 30.0       # a key unseen this long stops counting toward its replica's keys
HOME_S = 3600.0     # ... and this long, its home is forgotten
MAX_KEYS = 100_000  # the least recently seen keys beyond this are forgotten


class KeyHomes:
    def __init__(self, live_s: float = LIVE_S, home_s: float = HOME_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.live_s, self.home_s, self.max_keys, self.clock = live_s, home_s, max_keys, clock
        # key -> (replica id, last seen), least recently seen first: every key remembered, and the live ones
        self._homes: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._live: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._count: Counter[str] = Counter()  # live keys per replica id

    def home(self, key: bytes, replicas: Sequence[Replica]) -> Replica:
        """``key``'s replica among ``replicas``: where it went before, else placed now."""
        now = self.clock()
        self._expire(now)
        by_id = {r.id: r for r in replicas}
        known = self._homes.get(key)
        chosen = by_id[known[0]] if known is not None and known[0] in by_id else self._place(key, replicas)
        self._remember(key, chosen.id, now)
        return chosen

    def live(self) -> dict[str, int]:
        """Live keys per replica id (tests, logs)."""
        return {rid: n for rid, n in self._count.items() if n}

    def _place(self, key: bytes, replicas: Sequence[Replica]) -> Replica:
        return within(rendezvous(replicas, key), KEY_BALANCE, load=lambda r: self._count[r.id])[0]

    def _remember(self, key: bytes, replica_id: str, now: float) -> None:
        self._homes.pop(key, None)
        self._homes[key] = (replica_id, now)
        old = self._live.pop(key, None)
        if old is not None:
            self._count[old[0]] -= 1
        self._live[key] = (replica_id, now)
        self._count[replica_id] += 1
        while len(self._homes) > self.max_keys:
            self._forget(self._homes)
        while len(self._live) > self.max_keys:
            self._forget(self._live)

    def _expire(self, now: float) -> None:
        while self._live and now - next(iter(self._live.values()))[1] > self.live_s:
            self._forget(self._live)
        while self._homes and now - next(iter(self._homes.values()))[1] > self.home_s:
            self._forget(self._homes)

    def _forget(self, keys: OrderedDict[bytes, tuple[str, float]]) -> None:
        _, (replica_id, _) = keys.popitem(last=False)
        if keys is self._live:
            self._count[replica_id] -= 1
