"""Ground truth through a real worker app (in process, real onnxruntime engine) and a real statistics
service: logged requests' predictions reach the service with their events, feedback on the three front
ends is joined to them at once, and Prometheus reads each version's live accuracy and counts; bad
feedback is a 4xx in each front end's shape; feedback is written to the prediction log beside the
request's record; a worker whose statistics service is away answers 503."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from registry.artifacts import ArtifactStore
from registry.rollout_metrics import PrometheusSource, StatisticsServiceSource
from serving.settings import WorkerSettings
from serving.worker.app import create_app
from tests.serving.statistics.support import Prometheus, Service
from tests.serving.worker.support import endpoint_spec, snapshot
from tests.support.procs import free_port

TEXTS = [f"sentence number {i} about {'rain' if i % 3 else 'sun'}" for i in range(40)]


def worker(home: Path, port: int, token: str, spec: dict) -> TestClient:
    settings = WorkerSettings(home=home, artifact_dir=home / "artifacts", control_plane_url="http://127.0.0.1:9",
                              statistics_enabled=True, statistics_host="127.0.0.1", statistics_port=port,
                              kafka_bootstrap_servers=None, worker_token=token)
    return TestClient(create_app(settings, snapshot=snapshot(spec)))


@pytest.fixture
def logged_spec(tiny_model, tmp_path):
    store = ArtifactStore(tmp_path / "home" / "artifacts")
    spec = endpoint_spec("fb", tiny_model, store, tmp_path, versions=((1, 50.0), (2, 50.0)))
    return {**spec, "prediction_log": {"sample": 100}}


def test_feedback_is_joined_and_prometheus_reads_each_versions_live_accuracy(
        prom: Prometheus, stats_service: Service, logged_spec, tiny_model, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with worker(home, stats_service.port, stats_service.env["SERVING_WORKER_TOKEN"], logged_spec) as client:
        served = []
        for text in TEXTS:
            r = client.post("/serve/fb", json={"text": text})
            assert r.status_code == 200
            served.append((r.headers["X-Request-Id"], r.headers["X-Model-Version"], r.json()["label"]))
        assert client.app.state.dataplane.recorder.flush(10)
        other = {a: b for a, b in (tiny_model.labels, tiny_model.labels[::-1])}
        want: dict[str, list[bool]] = {"1": [], "2": []}
        for i, (request_id, version, label) in enumerate(served[:30]):
            right = i % 3 != 0  # 20 right, 10 wrong
            truth = label if right else other[label]
            door = ("/serve/fb/feedback", "/v2/models/fb/feedback", "/serve/openai/v1/feedback")[i % 3]
            body = {"request_id": request_id, "label": truth, **({"model": "fb"} if "openai" in door else {})}
            r = client.post(door, json=body)
            assert r.status_code == 200, r.text
            assert r.json() == {"request_id": request_id, "endpoint": "fb", "version": version, "prediction": label,
                                "correct": right}
            want[version].append(right)
        # a second label for the same request, and ground truth for a request never seen
        again = client.post("/serve/fb/feedback", json={"request_id": served[0][0], "label": "x"})
        assert again.status_code == 409 and "already has its feedback" in again.json()["error"]
        log = client.app.state.dataplane.predictions.log
        assert log.flush(5)
    for version, rights in want.items():
        assert rights, "both versions served some requests"
        sel = f'endpoint="fb",version="{version}"'
        assert prom.wait_value(f"serving_feedback_labelled_total{{{sel}}}", float(len(rights))) == len(rights)
        assert prom.scalar(f"serving_feedback_correct_total{{{sel}}}") == sum(rights)
        assert prom.scalar(f"serving_live_labelled{{{sel}}}") == len(rights)
        assert prom.scalar(f"serving_live_accuracy{{{sel}}}") == pytest.approx(sum(rights) / len(rights))
        # what the accuracy rollout gate reads, from either source
        for source in (StatisticsServiceSource(stats_service.url), PrometheusSource(prom.url)):
            quality = source.quality("fb", int(version))
            assert quality.labelled == len(rights) and quality.accuracy == pytest.approx(sum(rights) / len(rights))
    records = [orjson.loads(line) for f in (home / "predictions").glob("*.jsonl") for line in f.read_bytes().splitlines()]
    feedback = [r for r in records if r.get("kind") == "feedback"]
    assert len(feedback) == 30 and {r["request_id"] for r in feedback} == {s[0] for s in served[:30]}
    assert {r["request_id"] for r in records if "kind" not in r} == {s[0] for s in served}


@pytest.mark.parametrize("door,body,status,words", [
    ("/serve/fb/feedback", {"request_id": "never-served", "label": "x"}, 404, "no logged request 'never-served'"),
    ("/v2/models/fb/feedback", {"request_id": "never-served", "label": "x"}, 404, "no logged request"),
    ("/serve/openai/v1/feedback", {"model": "fb", "request_id": "never-served", "label": "x"}, 404, "no logged request"),
    ("/serve/fb/feedback", {"request_id": "r"}, 400, "exactly one of 'label'"),
    ("/serve/fb/feedback", {"request_id": "r", "label": "a", "value": 1}, 400, "exactly one of 'label'"),
    ("/serve/fb/feedback", {"label": "a"}, 400, "'request_id' must be"),
    ("/serve/fb/feedback", {"request_id": "r", "value": "NaN"}, 400, "'value' must be a finite number"),
    ("/serve/nope/feedback", {"request_id": "r", "label": "a"}, 404, "nope"),
    ("/serve/openai/v1/feedback", {"request_id": "r", "label": "a"}, 400, "names its endpoint in 'model'"),
])
def test_bad_feedback_is_a_4xx_in_each_front_ends_shape(stats_service: Service, logged_spec, tmp_path: Path,
                                                        door, body, status, words) -> None:
    with worker(tmp_path / "home", stats_service.port, stats_service.env["SERVING_WORKER_TOKEN"], logged_spec) as c:
        r = c.post(door, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    message = error["message"] if "openai" in door else error
    assert words in message, message
    if "openai" in door:
        assert error["type"] == "invalid_request_error"


def test_a_worker_whose_statistics_service_is_away_answers_503(logged_spec, tmp_path: Path) -> None:
    with worker(tmp_path / "home", free_port(), "t", logged_spec) as c:
        r = c.post("/serve/fb/feedback", json={"request_id": "r", "label": "a"})
    assert r.status_code == 503 and "statistics service" in r.json()["error"] and r.headers.get("Retry-After")
