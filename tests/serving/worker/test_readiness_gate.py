"""Readiness gating inside one worker process (serving/worker/gate.py), in-process.

The engine is the real onnxruntime engine, wrapped so that the test decides when a version counts as
ready: a real engine's load cannot be held open at will, and what is under test is what the worker
does meanwhile. The real engines under load are in tests/serving/test_readiness_e2e.py."""
from __future__ import annotations

import time

from fastapi.testclient import TestClient

from serving.worker.app import create_app
from tests.serving.worker.support import endpoint_spec, snapshot, worker_settings

TEXT = {"text": "held until ready"}


class Held:
    """The onnxruntime engine, with versions the test holds back from being ready."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.held: set[int] = set()
        self.checks = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def is_ready(self, target) -> bool:
        self.checks += 1
        return target.version not in self.held and self.engine.is_ready(target)


def start(home, *specs):
    app = create_app(worker_settings(home), snapshot=snapshot(*specs))
    sync = app.state.dataplane.config
    held = sync.engines["onnxruntime"] = Held(sync.engines["onnxruntime"])
    client = TestClient(app)
    client.__enter__()
    return client, sync, held


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_replacing_deploy_keeps_old_routes_until_ready_then_switches(home, store, tiny_model, tmp_path):
    v1 = endpoint_spec("clf", tiny_model, store, tmp_path, versions=((1, 100.0),))
    other = endpoint_spec("other", tiny_model, store, tmp_path, versions=((1, 100.0),))
    client, sync, held = start(home, v1, other)
    try:
        held.held.add(2)
        v2 = endpoint_spec("clf", tiny_model, store, tmp_path, versions=((2, 100.0),))
        other2 = endpoint_spec("other", tiny_model, store, tmp_path, versions=((1, 50.0), (3, 50.0)))
        sync.apply(snapshot(v2, other2, revision=2))
        for _ in range(10):  # v2 not ready: v1 answers; "other" (v3 ready) switched with the config
            r = client.post("/serve/clf", json=TEXT)
            assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", r.text
        assert [t.version for t in sync.current.endpoints["other"].targets] == [1, 3]
        state = client.get("/status").json()["readiness"]["clf"]
        assert state["state"] == "pending" and state["waiting"] == ["clf_v2"], state
        assert state["serving"] == [[1, 100.0, "stable"]]
        assert sync.current.revision == 2
        checks = held.checks
        assert wait_for(lambda: held.checks > checks + 3), "the gate re-checks the waiting version"
        held.held.clear()
        assert wait_for(lambda: sync.current.endpoints["clf"].targets[0].version == 2), "switched once ready"
        r = client.post("/serve/clf", json=TEXT)
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "2"
        assert client.get("/status").json()["readiness"]["clf"]["state"] == "ready"
    finally:
        client.__exit__(None, None, None)


def test_a_newer_config_replaces_a_waiting_one(home, store, tiny_model, tmp_path):
    client, sync, held = start(home, endpoint_spec("clf", tiny_model, store, tmp_path, versions=((1, 100.0),)))
    try:
        held.held.update({2, 3})
        sync.apply(snapshot(endpoint_spec("clf", tiny_model, store, tmp_path, versions=((2, 100.0),)), revision=2))
        sync.apply(snapshot(endpoint_spec("clf", tiny_model, store, tmp_path, versions=((3, 100.0),)), revision=3))
        held.held.discard(2)  # the abandoned v2 becoming ready must not take the routes
        time.sleep(0.3)
        assert sync.current.endpoints["clf"].targets[0].version == 1
        held.held.clear()
        assert wait_for(lambda: sync.current.endpoints["clf"].targets[0].version == 3)
    finally:
        client.__exit__(None, None, None)


def test_a_brand_new_endpoint_is_installed_at_once_and_reported_pending_until_ready(home, store, tiny_model,
                                                                                   tmp_path):
    """Nothing to fall back on: it is routed at once (its engine answers 503 with Retry-After while
    the model loads, as Triton's does) and reported pending until ready."""
    client, sync, held = start(home)
    try:
        held.held.add(1)
        sync.apply(snapshot(endpoint_spec("fresh", tiny_model, store, tmp_path, versions=((1, 100.0),)), revision=2))
        assert "fresh" in sync.current.endpoints
        assert client.get("/status").json()["readiness"]["fresh"]["state"] == "pending"
        held.held.clear()
        assert wait_for(lambda: client.get("/status").json()["readiness"]["fresh"]["state"] == "ready")
        assert client.post("/serve/fresh", json=TEXT).status_code == 200
    finally:
        client.__exit__(None, None, None)
