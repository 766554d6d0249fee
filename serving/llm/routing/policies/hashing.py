"""Consistent hashing over replicas: rendezvous (highest random weight) and its bounded-load walk.

Rendezvous: each (key, replica) pair gets a score, and a key goes to the replica of highest score.
Adding a replica moves exactly the keys it now scores highest for (1/(N+1) of them on average), and
removing one moves only its own keys, each to its next choice: no table to agree on, the same answer in
every worker. Replicas are scored by their stable ``id``, so a restarted engine (on a new port) keeps
its keys.

Bounded load (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018):
walking the key's order, take the first replica whose load after this request stays within
``ceil(c * (total load + 1) / N) + headroom``. Some replica always fits for ``c >= 1``; a key moves off
its first choice only while that one carries more than ``c`` times the average plus ``headroom``
requests. The paper has no headroom; it is there for a caller whose keys are worth more than a few
requests of queue (prefix.py: a key's replica holds its cached prompt).
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Sequence

from serving.llm.routing.policies.base import Replica

BALANCE = 1.25  # c: a replica may carry 25% above the average before keys spill to their next choice


def score(key: bytes, replica_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + b"\0" + replica_id.encode(), digest_size=8).digest(), "big")


def rendezvous(replicas: Sequence[Replica], key: bytes) -> list[Replica]:
    """The replicas in ``key``'s order of preference."""
    return sorted(replicas, key=lambda r: score(key, r.id), reverse=True)


def _requests(replica: Replica) -> float:
    return replica.load


def capacity(replicas: Sequence[Replica], balance: float = BALANCE, headroom: int = 0,
             load: Callable[[Replica], float] = _requests) -> float:
    """The most one replica may carry once this request (or key: key_homes.py) is placed."""
    total = sum(load(r) for r in replicas) + 1
    return math.ceil(balance * total / max(len(replicas), 1)) + headroom


def within(ordered: Sequence[Replica], balance: float = BALANCE, headroom: int = 0,
           load: Callable[[Replica], float] = _requests) -> list[Replica]:
    """``ordered`` (every replica, in the order preferred), the first within capacity moved to the front;
    ``load``: what is bounded (requests running and waiting, unless told)."""
    cap = capacity(ordered, balance, headroom, load)
    first = next((r for r in ordered if load(r) + 1 <= cap), ordered[0] if ordered else None)
    return [first, *(r for r in ordered if r is not first)] if first is not None else []
