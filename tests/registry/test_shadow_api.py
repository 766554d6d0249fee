"""Shadow targets in the registry: `serving model add --shadow P%` / `serving canary shadow`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.registry.test_api import add_model, client, onnx_sha  # noqa: F401 (fixtures)


@pytest.fixture
def database_url(tmp_path: Path) -> str:  # SQLite only: the routes add no SQL of their own
    return f"sqlite:///{tmp_path / 'registry.db'}"


def routes(ep: dict) -> list[tuple[int, float, str]]:
    return sorted((t["version"], t["weight"], t["role"]) for t in ep["targets"])


def test_shadow_lifecycle(client, onnx_sha):  # noqa: F811
    for _ in range(4):
        add_model(client, "clf", onnx_sha)
    assert client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 2, "shadow": 10}).status_code == 404
    client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 1, "engine": "onnxruntime"})
    rev = client.get("/config").json()["revision"]
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 2, "shadow": 100}).json()
    assert routes(ep) == [(1, 100.0, "stable"), (2, 100.0, "shadow")]
    assert ep["engine"] == "onnxruntime"  # a shadow changes nothing else of the endpoint (the default engine is triton)
    snap = client.get("/config").json()
    assert snap["revision"] == rev + 1 and snap["endpoints"]["e"]["targets"][1]["role"] == "shadow"
    # another shadow replaces it
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 3, "shadow": 30}).json()
    assert routes(ep) == [(1, 100.0, "stable"), (3, 30.0, "shadow")]
    # the live version cannot be its own shadow; refusals change nothing
    r = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 1, "shadow": 30})
    assert r.status_code == 409 and "already answers" in r.text
    assert client.post("/endpoints/e/promote").status_code == 409  # a shadow is no canary: never promoted
    # a canary of another version keeps the shadow; weights name live versions only
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 4, "canary": 10}).json()
    assert routes(ep) == [(1, 90.0, "stable"), (3, 30.0, "shadow"), (4, 10.0, "canary")]
    ep = client.put("/endpoints/e/weights", json={"weights": {"1": 50, "4": 50}}).json()
    assert routes(ep) == [(1, 50.0, "stable"), (3, 30.0, "shadow"), (4, 50.0, "canary")]
    assert client.put("/endpoints/e/weights", json={"weights": {"1": 50, "3": 50}}).status_code == 404
    # a canary of the shadowed version replaces the shadow
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 3, "canary": 10}).json()
    assert routes(ep) == [(1, 90.0, "stable"), (3, 10.0, "canary")]
    client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 2, "shadow": 50})
    ep = client.post("/endpoints/e/promote").json()  # the rollout ends: one stable version, no shadow
    assert routes(ep) == [(3, 100.0, "stable")]
    client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 2, "shadow": 50})
    assert client.post("/endpoints/e/rollback").status_code == 409  # stable + shadow: no canary to roll back
    ep = client.delete("/endpoints/e/shadow").json()
    assert routes(ep) == [(3, 100.0, "stable")]
    assert client.delete("/endpoints/e/shadow").status_code == 404


@pytest.mark.parametrize("body", [{"shadow": 0}, {"shadow": 101}, {"shadow": float("nan")}, {"shadow": "inf"},
                                  {"shadow": 10, "canary": 10}, {"shadow": 10, "max_versions": 2}])
def test_bad_shadows_are_refused(client, onnx_sha, body):  # noqa: F811
    add_model(client, "clf", onnx_sha)
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 1})
    raw = json.dumps({"endpoint": "e", "model": "clf", "version": 2, **body})  # NaN as JSON's NaN token
    r = client.post("/endpoints", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert routes(client.get("/endpoints/e").json()) == [(1, 100.0, "stable")]
