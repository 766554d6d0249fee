"""Canary routing: weights respected within a binomial bound, routing keys sticky, zero weight never chosen."""
from __future__ import annotations

import random
from collections import Counter

from scipy.stats import binomtest

from serving.worker.canary_split import choose


def test_shares_follow_weights():
    rng = random.Random(7)
    picks = Counter(choose(["v1", "v2"], [90, 10], rand=rng.random) for _ in range(20_000))
    # A wrong share (e.g. 20% or 5%) would give a p-value far below this.
    assert binomtest(picks["v2"], 20_000, 0.10).pvalue > 1e-4


def test_routing_keys_are_sticky_and_spread():
    first = {f"user-{i}": choose(["v1", "v2"], [50, 50], key=f"user-{i}") for i in range(2000)}
    again = {k: choose(["v1", "v2"], [50, 50], key=k) for k in first}
    assert first == again
    assert binomtest(Counter(first.values())["v2"], 2000, 0.5).pvalue > 1e-4


def test_zero_weight_is_never_chosen():
    assert {choose(["v1", "v2"], [0, 100], rand=lambda: 0.0) for _ in range(10)} == {"v2"}
    assert choose(["v1", "v2"], [100, 0], rand=lambda: 0.999999) == "v1"
