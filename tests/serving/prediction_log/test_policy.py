"""Which requests an endpoint's prediction log keeps (serving/prediction_log/policy.py)."""
from __future__ import annotations

import uuid

import pytest

from serving.prediction_log.policy import LogPolicy, check_fields, check_patterns, from_snapshot


def test_the_kept_share_is_the_asked_one_and_the_same_id_is_always_decided_alike():
    policy = LogPolicy(sample=10.0)
    ids = [str(uuid.UUID(int=i * 7919 + 13)) for i in range(20_000)]  # not random: ids of any shape count
    kept = [i for i in ids if policy.keeps(i)]
    # Binomial(20000, 0.1): mean 2000, sd 42.4; 5 sd either side (a false failure about once in 1.7 million)
    assert abs(len(kept) - 2000) <= 5 * 42.4, len(kept)
    assert all(policy.keeps(i) for i in kept), "the same id, the same decision (a shadow's record joins its live one)"
    assert all(LogPolicy(sample=100.0).keeps(i) for i in ids[:100])
    assert not any(LogPolicy(sample=0.0).keeps(i) for i in ids[:100])


def test_from_the_snapshot():
    assert from_snapshot(None) is None and from_snapshot({"sample": 0}) is None
    policy = from_snapshot({"sample": 25, "fields": ["inputs"], "redact": [r"\d{4}-\d{4}"], "max_bytes": 1024})
    assert policy.sample == 25 and policy.fields == {"inputs"} and policy.max_bytes == 1024
    assert policy.scrub("card 1234-5678 ok") == "card [REDACTED] ok"
    assert from_snapshot({"sample": 5, "redact": ["("]}) is None, "a bad pattern logs nothing, never fails the endpoint"


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="unknown field.*passwords"):
        check_fields(["inputs", "passwords"])
    with pytest.raises(ValueError, match="not a regular expression"):
        check_patterns(["[unclosed"])
