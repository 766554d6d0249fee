"""Load outcomes to Prometheus exposition, in process (serving/statistics/model_metrics.py): labels,
bounded reasons, the last outcome wins, readiness follows the config, and never a request count.
The worker side: tests/serving/worker/test_load_outcomes.py; real processes and Prometheus:
tests/serving/test_load_failure_statistics_e2e.py."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from serving.statistics.events import decode_batch, encode_batch, parse_event
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.recorder import StatisticsRecorder
from tests.serving.statistics.test_pipeline import samples
from tests.serving.statistics.test_recorder import MemorySender


def outcome(state: str, version: int | None = 2, reason: str | None = "model", model: str = "clf",
            engine: str = "onnxruntime") -> dict:
    return {"ts": 1.0, "endpoint": "e", "version": version,
            "model_state": {"state": state, "model": model, "engine": engine, "reason": reason}}


def config(*versions: int, revision: int = 1) -> dict:
    return {"revision": revision, "endpoints": {"e": {"targets": [{"model": "clf", "version": v} for v in versions]}}}


def test_failures_count_each_attempt_and_readiness_is_the_last_outcome() -> None:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    p.apply_snapshot(config(1, 2))
    p.handle_payload(encode_batch([outcome("ready", 1, None), outcome("failed"), outcome("failed")], source="a:1"))
    p.handle_payload(encode_batch([outcome("failed", reason="preprocess")], source="b:2"))
    assert samples(registry, "serving_model_load_failures_total") == {
        (("engine", "onnxruntime"), ("model", "clf"), ("reason", "model"), ("version", "2")): 2.0,
        (("engine", "onnxruntime"), ("model", "clf"), ("reason", "preprocess"), ("version", "2")): 1.0}
    assert samples(registry, "serving_model_ready") == {(("model", "clf"), ("version", "1")): 1.0,
                                                       (("model", "clf"), ("version", "2")): 0.0}
    p.handle_payload(encode_batch([outcome("ready", reason=None)]))
    assert samples(registry, "serving_model_ready")[(("model", "clf"), ("version", "2"))] == 1.0
    assert samples(registry, "serving_requests_total") == {}  # outcomes are not requests
    assert samples(registry, "serving_statistics_events_total") == {(("result", "accepted"),): 5.0}


def test_readiness_follows_what_the_workers_route_and_the_config() -> None:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    p.handle_payload(encode_batch([outcome("ready", 1, None), outcome("failed")]))  # before any config: kept
    p.apply_snapshot(config(1, 2))
    assert len(samples(registry, "serving_model_ready")) == 2
    # 1 and 2 replaced by 3: the failed 2 goes (nobody retries it), 1 may still answer until workers retire it
    p.apply_snapshot(config(3, revision=2))
    assert samples(registry, "serving_model_ready") == {(("model", "clf"), ("version", "1")): 1.0}
    p.handle_payload(encode_batch([outcome("ready", 3, None), outcome("retired", 1, None),
                                   outcome("retired", 5, None)]))  # 5 was never exported: nothing to remove
    assert samples(registry, "serving_model_ready") == {(("model", "clf"), ("version", "3")): 1.0}
    failures = samples(registry, "serving_model_load_failures_total")
    assert list(failures.values()) == [1.0]  # counters stay
    p.apply_snapshot({"revision": 3, "endpoints": {}})  # the endpoint was removed
    assert samples(registry, "serving_model_ready") == {}


def test_labels_stay_bounded_and_bad_outcomes_are_invalid_events() -> None:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    p.handle_payload(encode_batch([outcome("failed", reason="RuntimeError: /secret/path is gone"),
                                   outcome("failed", reason=None), outcome("loading"),
                                   {**outcome("failed"), "model_state": "failed"},
                                   outcome("failed", model="m" * 129)]))
    assert samples(registry, "serving_model_load_failures_total") == {
        (("engine", "onnxruntime"), ("model", "clf"), ("reason", "other"), ("version", "2")): 2.0}
    assert samples(registry, "serving_statistics_events_total") == {(("result", "accepted"),): 2.0,
                                                                    (("result", "invalid"),): 3.0}


def test_the_recorder_sends_an_outcome_as_one_event_the_service_parses() -> None:
    sender = MemorySender()
    recorder = StatisticsRecorder(sender, source="w:1")
    recorder.record_load("e", 7, model="clf", engine="triton", state="failed", reason="model")
    recorder.close()
    (payload,) = sender.batches
    (raw,) = decode_batch(payload).events
    event = parse_event(raw)
    assert (event.endpoint, event.version) == ("e", 7)
    assert event.model_state is not None and event.model_state.to_dict() == {
        "state": "failed", "model": "clf", "engine": "triton", "reason": "model"}
    assert parse_event(event.to_dict()) == event
