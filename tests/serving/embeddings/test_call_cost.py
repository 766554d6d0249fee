"""The per-call cost the token batcher weighs padding against, fitted on its calls: a call of
``a + b x tokens`` seconds costs ``a / b`` tokens; too few calls, or sizes all alike, or times that do
not grow with the tokens, give the default."""
from __future__ import annotations

import numpy as np
import pytest

from serving.embeddings.call_cost import BOUNDS, DEFAULT_TOKENS, MIN_CALLS, CallCost


def _fed(sizes, seconds) -> CallCost:
    cost = CallCost()
    for x, y in zip(sizes, seconds):
        cost.observe(int(x), float(y))
    return cost


def test_the_fit_recovers_the_fixed_share_of_a_call_in_tokens():
    sizes = np.random.default_rng(0).integers(20, 700, size=200)
    noise = np.random.default_rng(1).normal(0, 0.0002, size=200)
    cost = _fed(sizes, 0.002 + 0.000219 * sizes + noise)  # MiniLM-L6 on 2 CPU cores: 2 ms + 0.219 ms a token
    assert cost.tokens == pytest.approx(2.0 / 0.219, rel=0.15)


def test_recent_calls_weigh_most():
    sizes = np.random.default_rng(2).integers(20, 700, size=400)
    cost = _fed(sizes, np.concatenate([0.002 + 0.0002 * sizes[:200], 0.02 + 0.0002 * sizes[200:]]))
    assert cost.tokens == pytest.approx(100.0, rel=0.1)  # the later regime: 20 ms a call


@pytest.mark.parametrize("sizes, seconds", [
    ([100, 200] * (MIN_CALLS // 2 - 1), [0.01, 0.02] * (MIN_CALLS // 2 - 1)),  # too few calls
    ([128] * 40, np.linspace(0.01, 0.02, 40)),                                 # one size only
    (list(range(10, 410, 10)), [0.01] * 40),                                    # time flat in tokens
])
def test_no_fit_gives_the_default(sizes, seconds):
    assert _fed(sizes, seconds).tokens == DEFAULT_TOKENS


def test_the_fit_stays_within_bounds():
    sizes = list(range(10, 410, 10))
    assert _fed(sizes, [5.0 + 1e-7 * x for x in sizes]).tokens == BOUNDS[1]
    assert _fed(sizes, [-0.01 + 0.001 * x for x in sizes]).tokens == BOUNDS[0]
