"""Requests by client key name and refusals by reason, through the statistics service's pipeline:
the same events the worker's recorder sends (tests/serving/statistics/worker_sim.py), counted exactly."""
from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from serving.statistics.events import EventError, encode_batch, parse_event
from serving.statistics.pipeline import StatisticsPipeline
from tests.serving.statistics.worker_sim import keyed_events


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_requests_by_key_and_refusals_by_reason_are_counted_apart():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    events = keyed_events("e", 1, 200, seed=7)
    pipeline.handle_payload(encode_batch(events, source="w:1"))

    by_key = Counter(e["key"] for e in events if "key" in e and "refused" not in e)
    refused = Counter((e.get("key", "none"), e["refused"]) for e in events if "refused" in e)
    assert by_key["web"] > 0 and by_key["batch"] > 0 and refused["batch", "rate"] > 0 and refused["none", "missing_key"] > 0
    for key, n in by_key.items():
        assert sample(registry, "serving_requests_by_key_total", endpoint="e", key=key) == n
    for (key, reason), n in refused.items():
        assert sample(registry, "serving_refusals_total", endpoint="e", key=key, reason=reason) == n
    # refusals never reach the endpoint's request counts (error rates, rollout gates)
    served = sum(1 for e in events if "refused" not in e)
    total = sum(sample(registry, "serving_requests_total", endpoint="e", version="1", status=s) for s in ("200", "500"))
    assert total == served
    assert sample(registry, "serving_requests_total", endpoint="e", version="none", status="429") == 0
    assert b"serving_refusals_total" in generate_latest(registry)


@pytest.mark.parametrize("field,value", [("key", ""), ("key", 5), ("refused", "x" * 200), ("refused", ["rate"])])
def test_bad_key_labels_are_refused_one_event_at_a_time(field, value):
    with pytest.raises(EventError):
        parse_event({"endpoint": "e", "status": 200, field: value})
