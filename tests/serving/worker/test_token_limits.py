"""Tokens per minute of a client key, in the worker's check (a fake clock for the budget): charged after
a request ends, refused only once spent, Retry-After the time until a token is back, a push that keeps
or resets the budget. End to end over real vLLM streams: tests/serving/llm/test_openai_e2e.py."""
from __future__ import annotations

import pytest

from serving.credentials import secret_sha256
from serving.worker.client_keys import ClientKeys
from serving.worker.errors import TooManyRequests

KEY, OTHER = "sk_" + "d" * 64, "sk_" + "e" * 64


def snapshot(tpm: int | None = 600, rate: float | None = None) -> dict:
    return {"client_keys": {
        "chat": {"sha256": secret_sha256(KEY), "endpoints": None, "rate": rate, "burst": None,
                 "tokens_per_minute": tpm},
        "free": {"sha256": secret_sha256(OTHER), "endpoints": None, "rate": None, "burst": None},
    }}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def keys():
    clock, refused = Clock(), []
    keys = ClientKeys(required=True, clock=clock, on_refusal=lambda *a: refused.append(a))
    keys.apply_snapshot(snapshot())
    keys.clock_, keys.refused_ = clock, refused
    return keys


def test_refused_only_once_the_minute_is_spent_and_the_running_request_is_not(keys):
    # 600 tokens a minute (10 a second); requests of 250 tokens each, charged when they end
    for _ in range(3):  # 600 -> 350 -> 100 -> -150: the third one crossed the limit and still ran whole
        assert keys.check(KEY, "llm") == "chat"
        keys.charge("chat", 250)
    with pytest.raises(TooManyRequests) as exc:
        keys.check(KEY, "llm")
    # 151 tokens short of one token at 10/s: 15.1 s, rounded up
    assert exc.value.status == 429 and exc.value.headers == {"Retry-After": "16"}
    assert "600 tokens per minute" in exc.value.message and "chat" in exc.value.message
    assert keys.refused_ == [("llm", "tokens", "chat", 429)]
    assert keys.check(OTHER, "llm") == "free"  # another key has its own budget (none)
    keys.clock_.now += 15.0  # 150 tokens back: -0.1 left, still short
    with pytest.raises(TooManyRequests) as exc:
        keys.check(KEY, "llm")
    assert exc.value.headers == {"Retry-After": "1"}
    keys.clock_.now += 0.2
    assert keys.check(KEY, "llm") == "chat"
    keys.clock_.now += 3600  # idle: refilled to one minute's tokens, not more
    keys.charge("chat", 599)
    assert keys.check(KEY, "llm") == "chat"
    keys.charge("chat", 1)
    with pytest.raises(TooManyRequests):
        keys.check(KEY, "llm")


def test_tokens_and_requests_limit_together(keys):
    keys.apply_snapshot(snapshot(tpm=60, rate=1.0))  # a new limit: a new, full budget
    assert keys.check(KEY, "llm") == "chat"
    with pytest.raises(TooManyRequests) as exc:  # the request rate (burst 1) says no first
        keys.check(KEY, "llm")
    assert "requests/s" in exc.value.message
    keys.clock_.now += 1.0
    keys.charge("chat", 100)
    with pytest.raises(TooManyRequests) as exc:  # the tokens say no, and the request bucket is not taken from
        keys.check(KEY, "llm")
    assert "tokens per minute" in exc.value.message and exc.value.headers == {"Retry-After": "41"}
    assert [r[1] for r in keys.refused_] == ["rate", "tokens"]


def test_a_push_keeps_an_unchanged_budget_and_resets_a_changed_one(keys):
    keys.charge("chat", 1000)
    keys.apply_snapshot(snapshot(tpm=600))
    with pytest.raises(TooManyRequests):
        keys.check(KEY, "llm")
    keys.apply_snapshot(snapshot(tpm=1200))
    assert keys.check(KEY, "llm") == "chat"
    keys.apply_snapshot(snapshot(tpm=None))  # limit removed: charges do nothing
    keys.charge("chat", 10**6)
    assert keys.check(KEY, "llm") == "chat"


def test_charges_without_a_key_or_keys_not_required_do_nothing():
    keys = ClientKeys(required=False)
    keys.apply_snapshot(snapshot(tpm=1))
    keys.charge("chat", 10**6)
    keys.charge(None, 5)
    assert keys.check(None, "llm") is None
