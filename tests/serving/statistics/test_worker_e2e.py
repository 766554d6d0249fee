"""Through the real FastAPI worker: its recorder posts to the statistics service, Prometheus counts.

The worker runs in process (ASGI TestClient, as in tests/serving/worker) with a real
onnxruntime engine and the built-in tokenizer preprocessor; everything after its
``record`` call is real: the embedded HTTP transport, the service, a Prometheus scrape.
"""
from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from registry.artifacts import ArtifactStore
from serving.settings import WorkerSettings
from serving.worker.app import create_app
from tests.serving.statistics.support import Prometheus, Service
from tests.serving.worker.support import endpoint_spec, snapshot

TEXTS = ["fine", "a somewhat longer sentence about the weather and the sea, to count its tokens"]


def test_worker_requests_reach_prometheus(prom: Prometheus, stats_service: Service, tiny_model, tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = ArtifactStore(home / "artifacts")
    spec = endpoint_spec("worker-e", tiny_model, store, tmp_path, versions=((1, 50.0), (2, 50.0)))
    settings = WorkerSettings(home=home, artifact_dir=home / "artifacts", control_plane_url="http://127.0.0.1:9",
                              statistics_enabled=True, statistics_host="127.0.0.1",
                              statistics_port=stats_service.port, kafka_bootstrap_servers=None)
    with TestClient(create_app(settings, snapshot=snapshot(spec))) as client:
        codes = [client.post("/serve/worker-e", json={"text": TEXTS[i % 2]}).status_code for i in range(40)]
    assert codes == [200] * 40  # leaving the client closes the recorder, which flushes it

    assert prom.wait_value('sum(serving_requests_total{endpoint="worker-e"})', 40.0) == 40.0
    assert prom.scalar('sum(serving_requests_total{endpoint="worker-e", status="200"})') == 40.0
    assert prom.scalar('count(serving_requests_total{endpoint="worker-e", status="200"})') == 2.0  # both versions
    for stage in ("preprocess", "inference", "postprocess"):
        assert prom.scalar(f'sum(serving_stage_latency_seconds_count{{endpoint="worker-e", stage="{stage}"}})') == 40.0
    # the tokenizer preprocessor's variables, declared for worker-e in the control plane's snapshot
    assert prom.scalar('sum(serving_variable_scalar_count{endpoint="worker-e", variable="tokens"})') == 40.0
    assert prom.scalar('sum(serving_variable_scalar_bucket{endpoint="worker-e", variable="tokens", le="8.0"})') == 20.0
    labels = prom.query('serving_variable_enum_total{endpoint="worker-e", variable="label"}')
    assert sum(float(r["value"][1]) for r in labels) == 40.0
    assert prom.scalar('sum(serving_variable_enum_total{endpoint="worker-e", variable="label", value="other"})') == 0
    scores = prom.query('serving_variable_value{endpoint="worker-e", variable="score"}')
    assert scores and all(0.0 <= float(r["value"][1]) <= 1.0 for r in scores)
