"""Through the real FastAPI worker: its recorder posts to the statistics service, Prometheus counts.

The worker runs in process (ASGI TestClient, as in tests/serving/worker) with a real
onnxruntime engine and the built-in tokenizer preprocessor; everything after its
``record`` call is real: the embedded HTTP transport, the service, a Prometheus scrape.
"""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from registry.artifacts import ArtifactStore
from serving.settings import WorkerSettings
from serving.worker.app import create_app
from tests.serving.statistics.conftest import METRICS
from tests.serving.statistics.conftest import snapshot as snapshot_of
from tests.serving.statistics.fake_control_plane import FakeControlPlane
from tests.serving.statistics.support import Prometheus, Service
from tests.support.procs import wait_until
from tests.serving.worker.support import endpoint_spec, snapshot
from tests.support.procs import free_port, serving_process, wait_http

TEXTS = ["fine", "a somewhat longer sentence about the weather and the sea, to count its tokens"]


def test_worker_requests_reach_prometheus(prom: Prometheus, stats_service: Service, tiny_model, tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = ArtifactStore(home / "artifacts")
    spec = endpoint_spec("worker-e", tiny_model, store, tmp_path, versions=((1, 50.0), (2, 50.0)))
    settings = WorkerSettings(home=home, artifact_dir=home / "artifacts", control_plane_url="http://127.0.0.1:9",
                              statistics_enabled=True, statistics_host="127.0.0.1",
                              statistics_port=stats_service.port, kafka_bootstrap_servers=None,
                              worker_token=stats_service.env["SERVING_WORKER_TOKEN"])
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


@pytest.mark.timeout(240)
def test_two_worker_processes_count_exactly(prom: Prometheus, stats_service: Service, control_plane: FakeControlPlane,
                                            tiny_model, tmp_path: Path) -> None:
    """`serving worker --workers 2` following the control plane: N requests in, N counted by PromQL."""
    store = ArtifactStore(tmp_path / "artifacts")
    spec = {**endpoint_spec("workers-e", tiny_model, store, tmp_path, versions=((1, 50.0), (2, 50.0))),
            "metrics": METRICS}
    snap = snapshot_of(2)
    snap["endpoints"]["workers-e"] = spec
    control_plane.publish(snap)
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SERVING_")},
           "SERVING_HOME": str(tmp_path / "home"), "SERVING_ARTIFACT_DIR": str(tmp_path / "artifacts"),
           "SERVING_CONTROL_PLANE_URL": control_plane.url, "SERVING_WORKER_PORT": str(port),
           "SERVING_STATISTICS_HOST": "127.0.0.1", "SERVING_STATISTICS_PORT": str(stats_service.port),
           "SERVING_WORKER_TOKEN": stats_service.env["SERVING_WORKER_TOKEN"]}
    url = f"http://127.0.0.1:{port}"
    with serving_process(["worker", "--workers", "2"], env, tmp_path / "worker.log") as proc:
        wait_http(url + "/v2/health/live", timeout=120, proc=proc)
        ready: set[int] = set()

        def both_ready() -> bool:  # a new connection each time: the kernel spreads them over processes
            status = httpx.get(url + "/status", timeout=5).json()
            if "workers-e" in status["endpoints"]:
                ready.add(status["pid"])
            return len(ready) == 2

        wait_until(both_ready, timeout=90, interval=0.1, what="both worker processes loaded workers-e")
        n = 60
        codes = [httpx.post(url + "/serve/workers-e", json={"text": TEXTS[i % 2]}, timeout=30).status_code
                 for i in range(n)]
        assert codes == [200] * n
        assert prom.wait_value('sum(serving_requests_total{endpoint="workers-e"})', float(n)) == n
        assert prom.scalar('sum(serving_request_latency_seconds_count{endpoint="workers-e"})') == n
        assert prom.scalar('sum(serving_variable_scalar_count{endpoint="workers-e", variable="tokens"})') == n
        assert prom.scalar('count(serving_requests_total{endpoint="workers-e"})') == 2.0  # versions 1 and 2
