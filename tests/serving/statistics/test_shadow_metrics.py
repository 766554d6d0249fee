"""Shadow copies become their own series and never count as requests clients got."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from serving.statistics.events import EventError, encode_batch, parse_event
from serving.statistics.pipeline import StatisticsPipeline
from tests.serving.statistics.test_pipeline import samples


def shadow_event(status: int = 200, **shadow) -> dict:
    return {"endpoint": "e", "version": 2, "status": status, "latency_s": 0.02, "custom": {"label": "POSITIVE"},
            "stages": {"inference": 0.01}, "shadow": {"live_version": 1, **shadow}}


def test_shadow_events_have_their_own_series() -> None:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    p.apply_snapshot({"revision": 1, "endpoints": {"e": {"metrics": [{"name": "label", "kind": "enum",
                                                                         "values": ["POSITIVE"]}], "log_freq": 1.0}}})
    live = {"endpoint": "e", "version": 1, "status": 200, "latency_s": 0.01, "custom": {"label": "POSITIVE"}}
    events = [live, shadow_event(agree=True, mad=0.02), shadow_event(agree=False, mad=0.3),
              shadow_event(agree=True, mad=0.0), shadow_event(500, agree=None, mad=None), shadow_event(dropped=True)]
    assert p.handle_payload(encode_batch(events)) == 6
    assert samples(registry, "serving_requests_total") == {(("status", "200"), ("version", "1")): 1}
    assert samples(registry, "serving_variable_enum_total")[(("value", "POSITIVE"), ("variable", "label"),
                                                             ("version", "1"))] == 1  # the copies' labels: not counted
    assert samples(registry, "serving_shadow_requests_total") == {(("status", "200"), ("version", "2")): 3,
                                                                  (("status", "500"), ("version", "2")): 1}
    assert samples(registry, "serving_shadow_label_agreement_total") == {
        (("agree", "true"), ("version", "2")): 2, (("agree", "false"), ("version", "2")): 1}
    assert samples(registry, "serving_shadow_logit_mad_count") == {(("version", "2"),): 3}
    assert samples(registry, "serving_shadow_logit_mad_sum")[(("version", "2"),)] == pytest.approx(0.32)
    assert samples(registry, "serving_shadow_latency_seconds_count") == {(("version", "2"),): 4}
    assert samples(registry, "serving_shadow_dropped_total") == {(("version", "2"),): 1}
    p.handle_payload(encode_batch([{**shadow_event(agree=False), "version": 3}]))
    assert samples(registry, "serving_shadow_label_agreement_total")[(("agree", "true"), ("version", "3"))] == 0


def test_shadow_field_is_parsed_leniently_but_checked() -> None:
    assert parse_event({"endpoint": "e", "shadow": True}).shadow.agree is None
    assert parse_event({"endpoint": "e"}).shadow is None
    with pytest.raises(EventError):
        parse_event({"endpoint": "e", "shadow": {"mad": "NaN"}})
    with pytest.raises(EventError):
        parse_event({"endpoint": "e", "shadow": "yes"})
    assert parse_event(shadow_event(agree=True, mad=0.5)).to_dict()["shadow"] == {
        "live_version": 1, "agree": True, "mad": 0.5, "dropped": False}


def test_llm_copies_fill_the_agreement_histogram() -> None:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    events = [shadow_event(agree=True, agreement=1.0), shadow_event(agree=False, agreement=0.25),
              shadow_event(agree=True, mad=0.0)]  # an encoder's copy: no agreement figure
    assert p.handle_payload(encode_batch(events)) == 3
    assert samples(registry, "serving_llm_shadow_agreement_count") == {(("version", "2"),): 2}
    assert samples(registry, "serving_llm_shadow_agreement_sum")[(("version", "2"),)] == pytest.approx(1.25)
    assert samples(registry, "serving_llm_shadow_agreement_bucket")[(("le", "0.3"), ("version", "2"))] == 1
    with pytest.raises(EventError):
        parse_event(shadow_event(agreement=1.5))
