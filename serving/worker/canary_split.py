"""Canary routing: pick one of an endpoint's targets by weight.

With an ``X-Routing-Key`` the pick is a pure function of the key (a hash mapped to
[0, 1)), so the same user lands on the same version on every worker and after
restarts, as long as the weights do not change.
"""
from __future__ import annotations

import hashlib
import random
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def key_point(key: str) -> float:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose(targets: Sequence[T], weights: Sequence[float], key: str | None = None,
           rand: Callable[[], float] = random.random) -> T:
    """A shadow target (``role == "shadow"``) is never chosen: it only gets copies (serving/worker/shadow.py)."""
    if any(getattr(t, "role", None) == "shadow" for t in targets):
        pairs = [(t, w) for t, w in zip(targets, weights) if getattr(t, "role", None) != "shadow"]
        targets, weights = [t for t, _ in pairs], [w for _, w in pairs]
    total = sum(w for w in weights if w > 0)
    if total <= 0:
        return targets[0]
    point = (key_point(key) if key else rand()) * total
    acc = 0.0
    for target, weight in zip(targets, weights):
        if weight <= 0:
            continue
        acc += weight
        if point < acc:
            return target
    return next(t for t, w in zip(reversed(targets), reversed(weights)) if w > 0)
