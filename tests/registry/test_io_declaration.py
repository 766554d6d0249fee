"""Declared inputs/outputs and ClearML-style endpoints at the control plane, on SQLite and PostgreSQL.

A declaration that does not fit the model is refused at deploy with a 422 naming the tensor, and
nothing already stored changes."""
from __future__ import annotations

import pytest

from tests.registry.test_api import add_model, client, onnx_sha  # noqa: F401  (fixtures)


def deploy(client, **body):
    return client.post("/endpoints", json={"endpoint": "e", "model": "m", **body})


def io(*inputs, outputs=()):
    return {"inputs": [dict(zip(("name", "dtype", "shape"), i)) for i in inputs],
            "outputs": [dict(zip(("name", "dtype", "shape"), o)) for o in outputs]}


@pytest.fixture
def model(client, onnx_sha):  # noqa: F811
    return add_model(client, "m", onnx_sha)


def test_declaration_is_stored_whole_and_sent_to_workers(client, model):
    r = deploy(client, io=io(("attention_mask", "int32", [-1]), ("input_ids", "int64", [-1]),
                             outputs=[("logits", "float64", [2])]), batching={"max_batch_size": 8})
    assert r.status_code == 201, r.text
    stored = r.json()["io"]
    assert stored["inputs"] == [{"name": "attention_mask", "dtype": "INT32", "shape": [-1, -1]},
                                {"name": "input_ids", "dtype": "INT64", "shape": [-1, -1]}]
    assert stored["outputs"] == [{"name": "logits", "dtype": "FP64", "shape": [-1, 2]}]
    assert client.get("/config").json()["endpoints"]["e"]["io"] == stored


def test_declared_tensors_default_to_no_batching_as_clearml(client, model):
    r = deploy(client, io=io(("input_ids", None, [-1, -1]), ("attention_mask", None, [-1, -1])))
    assert r.status_code == 201, r.text
    assert r.json()["batching"]["max_batch_size"] == 0
    assert r.json()["io"]["inputs"][0]["shape"] == [-1, -1]


@pytest.mark.parametrize("declaration,fragment", [
    (io(("input_ids",), ("attention_masks",)), "'attention_masks' is not an input"),
    (io(("input_ids",)), "['attention_mask'] of m:1 are not declared"),
    (io(("input_ids", "float32"), ("attention_mask",)), "declared float32 but m:1 has int64"),
    (io(("input_ids", None, [-1, -1, 3]), ("attention_mask",)), "declared with shape [-1, -1, -1, 3] (batch dimension included)"),
    (io(("input_ids",), ("attention_mask",), outputs=[("probs",)]), "'probs' is not an output"),
    (io(("input_ids", "complex128"), ("attention_mask",)), "data type 'complex128'"),
    (io(("input_ids",), ("input_ids",)), "declared more than once"),
])
def test_a_misdeclared_tensor_is_a_422_naming_it(client, model, declaration, fragment):
    assert deploy(client).status_code == 201
    before = client.get("/endpoints/e").json()
    r = deploy(client, io=declaration)
    assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert client.get("/endpoints/e").json() == before


def test_model_less_endpoints_are_custom_with_preprocess(client, onnx_sha):  # noqa: F811
    code = client.post("/artifacts", content=b"class Preprocess: pass\n").json()["sha256"]
    r = client.post("/endpoints", json={"endpoint": "p", "engine": "custom",
                                        "preprocess": {"kind": "user", "artifact": code}})
    assert r.status_code == 201 and r.json()["targets"] == []
    assert client.get("/config").json()["endpoints"]["p"]["targets"] == []
    r = client.post("/endpoints", json={"endpoint": "q", "engine": "sklearn",
                                        "preprocess": {"kind": "user", "artifact": code}})
    assert r.status_code == 400 and "engine sklearn needs a model" in r.json()["detail"]
    r = client.post("/endpoints", json={"endpoint": "q", "engine": "custom"})
    assert r.status_code == 400 and "--preprocess" in r.json()["detail"]


def test_auto_update_follows_the_newest_versions_with_their_weights(client, onnx_sha):  # noqa: F811
    add_model(client, "m", onnx_sha)
    r = client.post("/endpoints", json={"endpoint": "auto", "model": "m", "max_versions": 2})
    assert r.status_code == 201 and [t["version"] for t in r.json()["targets"]] == [1]
    add_model(client, "m", onnx_sha)
    routes = {t["version"]: t["weight"] for t in client.get("/endpoints/auto").json()["targets"]}
    assert routes == {1: 0.0, 2: 100.0}
    r = client.put("/endpoints/auto/newest-weights", json={"weights": [0.25, 0.75]})
    assert r.status_code == 200, r.text
    add_model(client, "m", onnx_sha)
    routes = {t["version"]: t["weight"] for t in client.get("/endpoints/auto").json()["targets"]}
    assert routes == {2: 25.0, 3: 75.0}
    assert client.put("/endpoints/auto/newest-weights", json={"weights": [0, 0]}).status_code == 422
