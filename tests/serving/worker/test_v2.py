"""The v2 protocol in-process, with request bodies built and answers parsed by ``tritonclient.http`` itself."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from transformers import AutoTokenizer

from tests.serving.worker.test_serve_rest import direct

TEXT = "binary tensors travel after the JSON header"


def tokens(bundle, text=TEXT):
    enc = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))([text], return_tensors="np")
    return {k: v.astype(np.int64) for k, v in enc.items()}


def request(feeds, binary: bool, outputs=("logits",)):
    inputs = []
    for name, array in feeds.items():
        tensor = triton_http.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    wanted = [triton_http.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    body, header_length = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=wanted)
    headers = {"Inference-Header-Content-Length": str(header_length)} if header_length else {}
    return body, headers


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_onnxruntime(make_client, clf_spec, tiny_model, binary):
    client, _ = make_client(clf_spec)
    body, headers = request(tokens(tiny_model), binary)
    r = client.post("/v2/models/clf/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["X-Model-Version"] == "1"
    result = triton_http.InferResult.from_response_body(
        r.content, header_length=int(r.headers["Inference-Header-Content-Length"]) if binary else None)
    np.testing.assert_allclose(result.as_numpy("logits"), direct(tiny_model, [TEXT]), atol=1e-4)
    assert result.get_response()["model_version"] == "1"


def test_metadata_and_health(make_client, clf_spec):
    client, _ = make_client(clf_spec)
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2/models/clf").json()  # a tokenizer endpoint: text in, /serve's answer out
    assert meta["versions"] == ["1"] and meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["platform"] == "onnxruntime_onnx"  # Triton's name for an ONNX model (engine onnxruntime)
    assert meta["outputs"] == [{"name": "label", "datatype": "BYTES", "shape": [-1]},
                               {"name": "score", "datatype": "FP32", "shape": [-1]},
                               {"name": "logits", "datatype": "FP32", "shape": [-1, 2]}]
    assert client.get("/v2/models/clf/ready").status_code == 200
    assert client.get("/v2/models/clf/versions/1/ready").status_code == 200
    assert client.get("/v2/models/clf/versions/3/ready").status_code == 404
    assert client.get("/v2/models/other/ready").status_code == 404


def test_wrong_tensors_are_400_naming_the_tensor(make_client, clf_spec, tiny_model):
    client, _ = make_client(clf_spec)
    feeds = tokens(tiny_model)
    cases = [
        ({**feeds, "input_ids": feeds["input_ids"][0]}, "input 'input_ids' has shape"),
        ({k: v for k, v in feeds.items() if k != "attention_mask"}, "missing model input(s) ['attention_mask']"),
    ]
    for bad, words in cases:
        body, headers = request(bad, binary=False)
        r = client.post("/v2/models/clf/infer", content=body, headers=headers)
        assert r.status_code == 400 and words in r.json()["error"], r.text
    r = client.post("/v2/models/clf/infer", json={"inputs": [{"name": "input_ids", "shape": [1, 3],
                                                               "datatype": "FP128", "data": [1, 2, 3]}]})
    assert r.status_code == 400 and "unknown datatype 'FP128'" in r.json()["error"]
    r = client.post("/v2/models/clf/infer", json={"inputs": [{"name": "input_ids", "shape": [2, 2],
                                                               "datatype": "INT64", "data": [1, 2, 3]}]})
    assert r.status_code == 400 and "does not fit shape [2, 2]" in r.json()["error"]
    r = client.post("/v2/models/clf/infer", json={"inputs": []})
    assert r.status_code == 400 and '"inputs"' in r.json()["error"]
    body, headers = request(feeds, binary=False, outputs=("probabilities",))
    r = client.post("/v2/models/clf/infer", content=body, headers=headers)
    assert r.status_code == 400 and "unknown output(s) ['probabilities']" in r.json()["error"]
