"""A worker's prediction-log counts through the statistics pipeline: written and dropped records by
endpoint, counted exactly and never as requests; a malformed count is refused."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from serving.statistics.events import EventError, encode_batch, parse_event
from serving.statistics.pipeline import StatisticsPipeline


def test_counts_add_up_by_endpoint_and_count_no_request():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    events = [{"endpoint": "a", "version": None, "prediction_log": {"written": 30, "dropped": 0}},
              {"endpoint": "a", "version": None, "prediction_log": {"written": 5, "dropped": 7}},
              {"endpoint": "b", "version": None, "prediction_log": {"dropped": 2}}]
    pipeline.handle_payload(encode_batch(events, source="w:1"))
    value = lambda e, o: registry.get_sample_value("serving_prediction_log_records_total",  # noqa: E731
                                                   {"endpoint": e, "outcome": o}) or 0.0
    assert (value("a", "written"), value("a", "dropped"), value("b", "written"), value("b", "dropped")) == (35, 7, 0, 2)
    assert not any(s.name == "serving_requests_total" for f in registry.collect() for s in f.samples)


@pytest.mark.parametrize("counts", ["x", {"written": -1}, {"dropped": 1.5}, {"written": True}])
def test_a_malformed_count_is_refused(counts):
    with pytest.raises(EventError, match="prediction_log"):
        parse_event({"endpoint": "a", "prediction_log": counts})
