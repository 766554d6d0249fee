"""Encoder endpoints' statistics: the event's ``embedding`` counts become token, input and batch-size
series, a shadow copy's ``cosine`` its own histogram; both parsed leniently but checked."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from serving.statistics.events import EventError, encode_batch, parse_event
from serving.statistics.pipeline import StatisticsPipeline
from tests.serving.statistics.test_pipeline import samples


def event(**embedding) -> dict:
    return {"endpoint": "emb", "version": 1, "status": 200, "latency_s": 0.01, "embedding": embedding}


def test_tokens_inputs_and_batch_sizes() -> None:
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    events = [event(task="embed", inputs=32, tokens=400, batches=[16, 16]), event(task="embed", inputs=1, tokens=9,
                                                                                   batches=[]),
              {"endpoint": "emb", "version": 1, "status": 200, "latency_s": 0.01}]  # not an encoder's: no counts
    assert pipeline.handle_payload(encode_batch(events)) == 3
    version = (("version", "1"),)
    assert samples(registry, "serving_embedding_tokens_total") == {version: 409}
    assert samples(registry, "serving_embedding_inputs_per_request_sum") == {version: 33}
    assert samples(registry, "serving_embedding_tokens_per_request_count") == {version: 2}
    assert samples(registry, "serving_embedding_batch_size_count") == {version: 2}
    assert samples(registry, "serving_embedding_batch_size_sum") == {version: 32}
    assert samples(registry, "serving_requests_total") == {(("status", "200"), ("version", "1")): 3}


def test_shadow_cosine_has_its_histogram() -> None:
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    copy = {"endpoint": "emb", "version": 2, "status": 200, "latency_s": 0.02,
            "shadow": {"live_version": 1, "agree": False, "mad": 0.1, "cosine": 0.42}}
    pipeline.handle_payload(encode_batch([copy]))
    assert samples(registry, "serving_shadow_embedding_cosine_sum") == {(("version", "2"),): pytest.approx(0.42)}
    assert parse_event(copy).to_dict()["shadow"]["cosine"] == 0.42


def test_bad_fields_are_dropped_or_refused() -> None:
    counts = parse_event(event(task="cluster", inputs=-3, tokens="many", batches=[4, "x", 0, True])).embedding
    assert (counts.task, counts.inputs, counts.tokens, counts.batches) == ("embed", 0, 0, (4,))
    assert parse_event(event()).embedding.batches == ()
    with pytest.raises(EventError, match="cosine"):
        parse_event({"endpoint": "e", "shadow": {"cosine": 1.5}})
