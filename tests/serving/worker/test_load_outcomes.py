"""Model load outcomes reach the statistics series (serving/worker/gate.py LoadOutcomes), in-process.

A real worker app (onnxruntime, the tokenizer) records through the real ``StatisticsRecorder``, whose
transport hands each encoded batch to a real ``StatisticsPipeline``: what is checked is the series a
scrape of the statistics service would show. Real processes and Prometheus:
tests/serving/test_load_failure_statistics_e2e.py."""
from __future__ import annotations

from dataclasses import replace

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.recorder import StatisticsRecorder
from serving.worker.app import create_app
from tests.serving.test_readiness_e2e import broken_onnx
from tests.serving.worker.support import endpoint_spec, snapshot, worker_settings

TEXT = {"text": "still answered by the old version"}


class IntoPipeline:
    """A transport that hands each batch to an in-process statistics pipeline."""

    def __init__(self, pipeline: StatisticsPipeline) -> None:
        self.pipeline = pipeline

    def send(self, payload: bytes, count: int) -> None:
        self.pipeline.handle_payload(payload)

    def failed_events(self) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass


class Series:
    def __init__(self, registry: CollectorRegistry, recorder: StatisticsRecorder) -> None:
        self.registry, self.recorder = registry, recorder

    def failures(self, version: int, reason: str = "model", endpoint: str = "clf") -> float | None:
        self.recorder.flush()
        return self.registry.get_sample_value("serving_model_load_failures_total", {
            "endpoint": endpoint, "model": "clf", "version": str(version), "engine": "onnxruntime", "reason": reason})

    def ready(self, version: int, endpoint: str = "clf") -> float | None:
        self.recorder.flush()
        return self.registry.get_sample_value("serving_model_ready",
                                              {"endpoint": endpoint, "model": "clf", "version": str(version)})


def test_a_failed_load_is_counted_and_a_later_good_version_is_ready(home, store, tiny_model, tmp_path):
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    recorder = StatisticsRecorder(IntoPipeline(pipeline), source="test:1")
    series = Series(registry, recorder)
    bad = replace(tiny_model, onnx_path=broken_onnx(tiny_model, tmp_path / "bad.onnx"))
    spec = lambda bundle, version, name="clf": endpoint_spec(name, bundle, store, tmp_path,  # noqa: E731
                                                             versions=((version, 100.0),))
    app = create_app(worker_settings(home), snapshot=snapshot(spec(tiny_model, 1)), recorder=recorder)
    sync = app.state.dataplane.config
    try:
        with TestClient(app) as client:
            assert series.ready(1) == 1.0  # routed at start: ready
            assert series.failures(1) is None

            # version 2 cannot be loaded: one failed attempt, version 1 keeps answering
            sync.apply(snapshot(spec(bad, 2), revision=2))
            pipeline.apply_snapshot(snapshot(spec(bad, 2), revision=2))
            assert series.failures(2) == 1.0
            assert series.ready(2) == 0.0
            assert series.ready(1) == 1.0  # out of the config, still routed: the old route is shown
            for _ in range(3):
                r = client.post("/serve/clf", json=TEXT)
                assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", r.text
            assert client.get("/status").json()["readiness"]["clf"]["state"] == "failed"

            # the next config (another endpoint added) tries version 2 again: a second attempt, counted
            sync.apply(snapshot(spec(bad, 2), spec(tiny_model, 1, "other"), revision=3))
            assert series.failures(2) == 2.0
            assert series.ready(2) == 0.0
            assert series.ready(1, "other") == 1.0

            # version 3 loads: ready; the worker retires 1 (replaced) and 2 (no longer tried)
            good = snapshot(spec(tiny_model, 3), spec(tiny_model, 1, "other"), revision=4)
            sync.apply(good)
            assert series.ready(3) == 1.0
            assert series.ready(2) is None and series.ready(1) is None
            assert series.ready(1, "other") == 1.0
            assert series.failures(2) == 2.0  # counters only grow
            r = client.post("/serve/clf", json=TEXT)
            assert r.status_code == 200 and r.headers["X-Model-Version"] == "3"
    finally:
        recorder.close()
    requests = {v: registry.get_sample_value("serving_requests_total",
                                             {"endpoint": "clf", "version": v, "status": "200"})
                for v in ("1", "2", "3")}
    assert requests == {"1": 3.0, "2": None, "3": 1.0}  # load outcomes are never counted as requests
    # 4 requests, and 7 outcomes: clf 1 ready, clf 2 failed twice, other 1 ready, clf 3 ready, clf 1 and 2
    # retired (each once: no outcome is repeated but a failed attempt)
    assert registry.get_sample_value("serving_statistics_events_total", {"result": "accepted"}) == 4 + 7


def test_a_preprocessing_that_cannot_be_built_fails_with_its_reason(home, store, tiny_model, tmp_path):
    """A tokenizer artifact the worker cannot fetch: the version counts a failure of reason preprocess."""
    registry = CollectorRegistry()
    recorder = StatisticsRecorder(IntoPipeline(StatisticsPipeline(registry)), source="test:2")
    series = Series(registry, recorder)
    good = endpoint_spec("tok", tiny_model, store, tmp_path)
    broken = {**endpoint_spec("tok", tiny_model, store, tmp_path, versions=((2, 100.0),)),
              "preprocess": {"kind": "tokenizer", "artifact": "0" * 64, "options": {"max_length": 128}}}
    app = create_app(worker_settings(home), snapshot=snapshot(good), recorder=recorder)
    try:
        with TestClient(app) as client:
            app.state.dataplane.config.apply(snapshot(broken, revision=2))
            assert series.failures(2, "preprocess", "tok") == 1.0
            assert series.ready(2, "tok") == 0.0
            assert series.ready(1, "tok") == 1.0
            assert client.post("/serve/tok", json=TEXT).headers["X-Model-Version"] == "1"
    finally:
        recorder.close()
