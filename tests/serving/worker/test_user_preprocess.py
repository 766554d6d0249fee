"""ClearML Serving preprocess.py files run unchanged, through a real worker (in-process)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tests.serving.worker.support import endpoint_spec
from tests.serving.worker.test_serve_rest import direct

FILES = Path(__file__).parents[2] / "preprocess" / "files"


def user_spec(name, bundle, store, tmp_path, file, engine):
    sha = store.put_file(FILES / file)[0]
    return endpoint_spec(name, bundle, store, tmp_path, engine=engine,
                         preprocess={"kind": "user", "artifact": sha, "options": {}})


def declared(*names: str) -> dict:
    return {"inputs": [{"name": n, "dtype": None, "shape": None} for n in names], "outputs": []}


def test_clearml_preprocess_list_without_declared_names_is_refused(make_client, store, tmp_path, tiny_model):
    """A list of several tensors could be bound only by position: refused, naming the inputs."""
    client, _ = make_client(user_spec("user", tiny_model, store, tmp_path, "clearml_text.py", "onnxruntime"))
    r = client.post("/serve/user", json={"text": "the food was cold", "tokenizer_dir": str(tiny_model.tokenizer_dir)})
    assert r.status_code == 422
    assert "declares no input names" in r.json()["error"] and "attention_mask" in r.json()["error"]


def test_clearml_preprocess_file_with_model_engine(make_client, store, tmp_path, tiny_model):
    spec = user_spec("user", tiny_model, store, tmp_path, "clearml_text.py", "onnxruntime")
    spec["io"] = declared("input_ids", "attention_mask", "token_type_ids")  # the order clearml_text.py returns
    client, recorder = make_client(spec)
    text = "the food was cold"
    r = client.post("/serve/user", json={"text": text, "tokenizer_dir": str(tiny_model.tokenizer_dir)})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"], direct(tiny_model, [text]), atol=1e-4)
    assert recorder.events[-1]["custom"] == {"words": 4}
    r = client.post("/serve/user", json={"tokenizer_dir": str(tiny_model.tokenizer_dir)})
    assert r.status_code == 422 and "preprocess() in preprocess.py raised KeyError" in r.json()["error"]


def test_custom_engine_gets_model_file_and_runs_process(make_client, store, tmp_path, tiny_model):
    client, recorder = make_client(user_spec("custom", tiny_model, store, tmp_path, "custom_engine.py", "custom"))
    r = client.post("/serve/custom", json={"x": [1, 2, 3.5]})
    assert r.status_code == 200, r.text
    assert r.json() == {"sum": 6.5, "model": hashlib.sha256(tiny_model.onnx_path.read_bytes()).hexdigest()}
    assert recorder.events[-1]["custom"] == {"n": 3}
    r = client.post("/serve/custom", json={"y": 1})
    assert r.status_code == 422 and "body needs x" in r.json()["error"]

def test_v2_on_a_preprocess_py_endpoint_takes_the_model_tensors(make_client, store, tmp_path, tiny_model):
    """What docs/serving.md says v2 takes there: the model's tensors, past the user's code; text is not
    tokenized (only the built-in tokenizer does that); a custom engine has no tensors: 400 naming /serve."""
    from tests.serving.worker.test_v2 import TEXT, request, tokens

    spec = user_spec("user", tiny_model, store, tmp_path, "clearml_text.py", "onnxruntime")
    custom = {**user_spec("code", tiny_model, store, tmp_path, "clearml_text.py", "custom"), "targets": []}
    client, _ = make_client(spec, custom)
    body, headers = request(tokens(tiny_model), binary=False)
    r = client.post("/v2/models/user/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["outputs"][0]["data"], direct(tiny_model, [TEXT]).ravel(), atol=1e-4)
    text = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}]}
    r = client.post("/v2/models/user/infer", json=text)
    assert r.status_code == 400 and "missing model input(s)" in r.json()["error"], r.text
    assert client.get("/v2/models/user").json()["inputs"][0]["name"] == "input_ids"
    r = client.post("/v2/models/code/infer", content=body, headers=headers)
    assert r.status_code == 400 and "/serve/code" in r.json()["error"], r.text
