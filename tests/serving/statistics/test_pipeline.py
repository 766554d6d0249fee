"""Events to Prometheus exposition, in process: edge cases the end-to-end tests do not reach."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.statistics.events import encode_batch
from serving.statistics.pipeline import StatisticsPipeline


def samples(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted((k, v) for k, v in s.labels.items() if k != "endpoint"))] = s.value
    return out


def pipeline(metrics: list[dict]) -> tuple[StatisticsPipeline, CollectorRegistry]:
    registry = CollectorRegistry()
    p = StatisticsPipeline(registry)
    p.apply_snapshot({"revision": 1, "endpoints": {"e": {"metrics": metrics, "log_freq": 1.0}}})
    return p, registry


def event(**custom) -> dict:
    return {"endpoint": "e", "version": 1, "status": 200, "latency_s": 0.01, "custom": custom}


def test_scalar_bucket_bounds_are_inclusive_and_lists_count_each_item() -> None:
    p, registry = pipeline([{"name": "x", "kind": "scalar", "buckets": [10, 1, 5]}])  # unsorted on purpose
    p.handle_payload(encode_batch([event(x=1), event(x=5), event(x=5.0001), event(x=[10, 11]), event(x="nan?")]))
    got = samples(registry, "serving_variable_scalar_bucket")
    assert {dict(k)["le"]: v for k, v in got.items()} == {"1.0": 1, "5.0": 2, "10.0": 4, "+Inf": 5}
    assert samples(registry, "serving_variable_scalar_count") == {(("variable", "x"), ("version", "1")): 5}


def test_redefining_a_variable_starts_its_series_afresh() -> None:
    p, registry = pipeline([{"name": "x", "kind": "scalar", "buckets": [1, 2]}])
    p.handle_payload(encode_batch([event(x=1), event(x=2)]))
    p.apply_snapshot({"revision": 2, "endpoints": {"e": {"metrics": [{"name": "x", "kind": "scalar",
                                                                       "buckets": [100]}]}}})
    p.handle_payload(encode_batch([event(x=50)]))
    got = samples(registry, "serving_variable_scalar_bucket")
    assert {dict(k)["le"]: v for k, v in got.items()} == {"100.0": 1, "+Inf": 1}


def test_versionless_events_undeclared_endpoints_and_bad_definitions() -> None:
    p, registry = pipeline([{"name": "x", "kind": "scalar"},  # no buckets: skipped, others still work
                            {"name": "y", "kind": "value"}])
    p.handle_payload(encode_batch([{**event(x=1, y=2), "version": None},
                                   {"endpoint": "unknown", "status": 404, "latency_s": 0.0, "custom": {"y": 1}}]))
    assert samples(registry, "serving_requests_total") == {(("status", "200"), ("version", "none")): 1,
                                                            (("status", "404"), ("version", "none")): 1}
    assert samples(registry, "serving_variable_value") == {(("variable", "y"), ("version", "none")): 2.0}
    assert samples(registry, "serving_variable_scalar_count") == {}


def test_numpy_values_from_preprocessors_are_encoded() -> None:
    import numpy as np

    p, registry = pipeline([{"name": "x", "kind": "value"}, {"name": "l", "kind": "enum", "values": ["a"]}])
    p.handle_payload(encode_batch([event(x=np.float32(0.5), l=np.str_("a"))]))
    assert samples(registry, "serving_variable_value") == {(("variable", "x"), ("version", "1")): 0.5}
    assert samples(registry, "serving_variable_enum_total")[(("value", "a"), ("variable", "l"), ("version", "1"))] == 1


def test_removed_variables_versions_and_endpoints_stop_being_exported() -> None:
    from serving.statistics.drift import DriftConfig

    registry = CollectorRegistry()
    p = StatisticsPipeline(registry, DriftConfig(reference_size=2, window_size=5, min_window=2))
    metrics = [{"name": "x", "kind": "value"}, {"name": "y", "kind": "value"}]
    targets = [{"version": 1}, {"version": 2}]
    p.apply_snapshot({"revision": 1, "endpoints": {"e": {"metrics": metrics, "targets": targets},
                                                   "f": {"metrics": metrics, "targets": targets}}})
    events = [{**event(x=i, y=i), "endpoint": ep, "version": v} for ep in "ef" for v in (1, 2) for i in range(4)]
    p.handle_payload(encode_batch(events))
    def series(name: str) -> set[tuple[str, str, str]]:
        return {(s.labels["endpoint"], s.labels["version"], s.labels["variable"])
                for f in text_string_to_metric_families(generate_latest(registry).decode())
                for s in f.samples if s.name == name}

    assert len(series("serving_drift_detected")) == 8  # 2 endpoints x 2 versions x 2 variables
    assert len(series("serving_variable_value")) == 8

    # y removed from e, version 2 of e retired, endpoint f deleted
    p.apply_snapshot({"revision": 2, "endpoints": {"e": {"metrics": metrics[:1], "targets": targets[:1]}}})
    assert series("serving_variable_value") == {("e", "1", "x")}
    assert series("serving_drift_detected") == {("e", "1", "x")}
    assert len(samples(registry, "serving_requests_total")) == 2  # counters of past requests stay
