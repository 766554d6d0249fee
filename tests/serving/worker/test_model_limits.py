"""Token ids past the vocabulary and sequences past the position table are the client's mistake:
a 422 naming the input and the limit read from the model file, on /serve and v2, before inference."""
from __future__ import annotations

import numpy as np
import pytest

from registry.signature import onnx_signature
from serving.worker.errors import brief
from tests.serving.worker.support import endpoint_spec


@pytest.fixture
def limited(tiny_model, store, tmp_path):
    spec = endpoint_spec("raw", tiny_model, store, tmp_path, preprocess={"kind": "none"})
    for target in spec["targets"]:
        target["signature"] = onnx_signature(tiny_model.onnx_path)  # as the registry stores it
    return spec


def test_the_registry_reads_vocabulary_and_positions_from_the_model(tiny_model):
    inputs = {i["name"]: i for i in onnx_signature(tiny_model.onnx_path)["inputs"]}
    assert inputs["input_ids"]["max_value"] == 30521  # the BERT vocabulary, 30,522 ids
    assert inputs["token_type_ids"]["max_value"] == 1
    assert all(i["max_length"] == 512 for i in inputs.values())


def tensors(ids: list[int]) -> dict:
    n = len(ids)
    return {"input_ids": [ids], "attention_mask": [[1] * n], "token_type_ids": [[0] * n]}


def v2(ids: list[int]) -> dict:
    return {"inputs": [{"name": k, "datatype": "INT64", "shape": [1, len(ids)], "data": np.ravel(v).tolist()}
                       for k, v in tensors(ids).items()]}


@pytest.mark.parametrize("ids,words", [
    ([101, 99999, 102], "input 'input_ids' has value 99999; the model takes 0 to 30521"),
    ([101, -5, 102], "input 'input_ids' has value -5"),
    ([101] + [2000] * 600 + [102], "has 602 positions; the model takes at most 512"),
])
def test_past_the_models_limits_is_422_on_every_protocol(make_client, limited, ids, words):
    client, recorder = make_client(limited)
    r = client.post("/serve/raw", json={"inputs": tensors(ids)})
    assert r.status_code == 422 and words in r.json()["error"], r.text
    r = client.post("/v2/models/raw/infer", json=v2(ids))
    assert r.status_code == 422 and words in r.json()["error"], r.text
    assert client.post("/serve/raw", json={"inputs": tensors([101, 2000, 102])}).status_code == 200
    assert [e["status"] for e in recorder.events] == [422, 422, 200]


def test_a_backend_traceback_becomes_its_last_line():
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 1\n    run()\n" \
            "onnxruntime.capi.Fail: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : idx=99999 out of range\n"
    assert brief(trace) == "onnxruntime.capi.Fail: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : idx=99999 out of range"
    assert brief("first\nsecond") == "first" and len(brief("x" * 1000)) == 240
