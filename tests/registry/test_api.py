"""Registry and control-plane API, on SQLite and on a real PostgreSQL."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper

from registry.api import create_app
from serving.settings import ControlPlaneSettings
from tests.support.auth import headers


def tiny_onnx(path: Path) -> Path:
    """A two-input graph, enough to check signature inference without torch."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 2], [0.5, -0.5])
    nodes = [
        helper.make_node("Add", ["input_ids", "attention_mask"], ["s"]),
        helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], keepdims=1),
        helper.make_node("Mul", ["m", "w"], ["logits"]),
    ]
    graph = helper.make_graph(nodes, "tiny", [ids, mask], [out], initializer=[w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture
def client(database_url: str, tmp_path: Path):
    settings = ControlPlaneSettings(home=tmp_path, database_url=database_url)
    with TestClient(create_app(settings)) as c:
        c.headers.update(headers(tmp_path))  # the bootstrap admin token the control plane wrote
        yield c


@pytest.fixture
def onnx_sha(client, tmp_path: Path) -> str:
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    return client.post("/artifacts", content=data).json()["sha256"]


def add_model(client, name: str, sha: str) -> dict:
    r = client.post("/models", json={"name": name, "artifact": sha})
    assert r.status_code == 201, r.text
    return r.json()


def test_versions_increment_per_name_and_signature_is_read_from_onnx(client, onnx_sha):
    assert [add_model(client, "a", onnx_sha)["version"] for _ in range(3)] == [1, 2, 3]
    b = add_model(client, "b", onnx_sha)
    assert b["version"] == 1
    assert b["signature"]["inputs"] == [
        {"name": "input_ids", "dtype": "INT64", "shape": [-1, -1]},
        {"name": "attention_mask", "dtype": "INT64", "shape": [-1, -1]},
    ]
    assert b["signature"]["outputs"] == [{"name": "logits", "dtype": "FP32", "shape": [-1, 2]}]
    assert [m["version"] for m in client.get("/models", params={"name": "a"}).json()] == [1, 2, 3]


def test_artifacts_are_content_addressed(client, onnx_sha, tmp_path):
    again = client.post("/artifacts", content=tiny_onnx(tmp_path / "again.onnx").read_bytes()).json()
    assert again["sha256"] == onnx_sha
    assert client.get(f"/artifacts/{onnx_sha}").content == (tmp_path / "m.onnx").read_bytes()
    assert client.get("/artifacts/" + "0" * 64).status_code == 404


def test_canary_lifecycle_bumps_revision_each_change(client, onnx_sha):
    for _ in range(2):
        add_model(client, "clf", onnx_sha)
    rev0 = client.get("/config").json()["revision"]
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 1}).json()
    assert [(t["version"], t["weight"]) for t in ep["targets"]] == [(1, 100.0)]
    ep = client.post("/endpoints", json={"endpoint": "e", "model": "clf", "canary": 10}).json()
    assert [(t["version"], t["weight"], t["role"]) for t in ep["targets"]] == [(1, 90.0, "stable"), (2, 10.0, "canary")]
    snap = client.get("/config").json()
    assert snap["revision"] == rev0 + 2
    target = snap["endpoints"]["e"]["targets"][1]
    assert target["triton_name"] == "clf_v2" and target["artifact"] == onnx_sha
    ep = client.put("/endpoints/e/weights", json={"weights": {"1": 70, "2": 30}}).json()
    assert [t["weight"] for t in ep["targets"]] == [70.0, 30.0]
    ep = client.post("/endpoints/e/promote").json()
    assert [(t["version"], t["weight"], t["role"]) for t in ep["targets"]] == [(2, 100.0, "stable")]
    client.post("/endpoints", json={"endpoint": "e", "model": "clf", "version": 1, "canary": 25})
    ep = client.post("/endpoints/e/rollback").json()
    assert [(t["version"], t["weight"]) for t in ep["targets"]] == [(2, 100.0)]
    assert client.get("/config").json()["revision"] == rev0 + 6


def test_metric_definitions_reach_the_snapshot(client, onnx_sha):
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    assert client.post("/endpoints/e/metrics", json={"name": "tokens", "kind": "scalar", "buckets": [8, 16, 32]}).status_code == 201
    client.post("/endpoints/e/metrics", json={"name": "label", "kind": "enum", "values": ["neg", "pos"]})
    client.put("/endpoints/e/log-freq", json={"log_freq": 0.5})
    ep = client.get("/config").json()["endpoints"]["e"]
    assert ep["metrics"] == [{"name": "label", "kind": "enum", "values": ["neg", "pos"]},
                             {"name": "tokens", "kind": "scalar", "buckets": [8.0, 16.0, 32.0]}]
    assert ep["log_freq"] == 0.5
    assert client.delete("/endpoints/e/metrics/nope").status_code == 404


@pytest.mark.parametrize("path,body,status,words", [
    ("/models", {"name": "bad\tname", "artifact": "x"}, 422, "printable characters"),
    ("/models", {"name": "m", "artifact": "0" * 64}, 404, "was not uploaded"),
    ("/endpoints", {"endpoint": "e", "model": "ghost"}, 404, "model ghost not found"),
    ("/endpoints", {"endpoint": "e", "model": "clf", "canary": 150}, 422, "canary"),
    ("/endpoints", {"endpoint": "new", "model": "clf", "canary": 10}, 404, "needs a current version"),
    ("/endpoints/e/metrics", {"name": "t", "kind": "scalar"}, 422, "buckets"),
])
def test_bad_requests_get_clear_errors_and_keep_state(client, onnx_sha, path, body, status, words):
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    before = client.get("/config").json()
    r = client.post(path, json=body)
    assert r.status_code == status
    assert words in r.text
    assert client.get("/config").json() == before


def test_conflicts(client, onnx_sha):
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    r = client.delete("/models/clf")
    assert r.status_code == 409 and "deployed on endpoint(s) e" in r.text
    r = client.put("/endpoints/e/weights", json={"weights": {"1": 60, "2": 30}})
    assert r.status_code == 422 and "add up to 100" in r.text
    r = client.post("/endpoints/e/promote")
    assert r.status_code == 409 and "no canary" in r.text
    custom = client.post("/models", json={"name": "c", "artifact": onnx_sha, "framework": "custom"}).json()
    r = client.post("/endpoints", json={"endpoint": "x", "model": "c", "engine": "triton"})
    assert r.status_code == 400 and "serves ONNX models" in r.text
    assert custom["version"] == 1
    assert client.get("/models", params={"name": "clf"}).json()[0]["version"] == 1


def test_state_survives_a_restart(database_url, tmp_path, onnx_sha, client):
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    before = client.get("/config").json()
    settings = ControlPlaneSettings(home=tmp_path, database_url=database_url)
    with TestClient(create_app(settings)) as again:  # migrations run again: a no-op
        assert again.get("/config", headers=headers(tmp_path)).json() == before
