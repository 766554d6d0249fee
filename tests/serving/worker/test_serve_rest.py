"""/serve in-process: answers equal onnxruntime on the same tokens; every bad input is a clear 4xx."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from transformers import AutoTokenizer

from tests.serving.worker.support import endpoint_spec

TEXTS = ["a short one", "a somewhat longer sentence about the weather and the sea, to force padding"]


def direct(bundle, texts):
    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(bundle.onnx_path))
    return sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0]


def test_single_and_batch_match_onnxruntime(make_client, clf_spec, tiny_model):
    client, recorder = make_client(clf_spec)
    r = client.post("/serve/clf", json={"text": TEXTS[1]})
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "1"
    expected = direct(tiny_model, [TEXTS[1]])[0]
    np.testing.assert_allclose(r.json()["logits"], expected, atol=1e-4)
    assert r.json()["label"] == tiny_model.labels[int(np.argmax(expected))]
    r = client.post("/serve/clf/1", json={"texts": TEXTS})
    got = np.array([p["logits"] for p in r.json()["predictions"]])
    np.testing.assert_allclose(got, direct(tiny_model, TEXTS), atol=1e-4)  # padded batch == reference batch
    event = recorder.events[0]
    assert event["endpoint"] == "clf" and event["version"] == 1 and event["status"] == 200
    assert set(event["stages"]) == {"preprocess", "inference", "postprocess"}
    assert event["custom"]["tokens"] == len(AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))(TEXTS[1])["input_ids"])
    assert event["custom"]["label"] == r.json()["predictions"][0]["label"]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "malformed JSON"),
    (b"", 400, "empty request body"),
    (b'{"txt": "hi"}', 422, 'missing field "text"'),
    (b'{"text": 3}', 422, '"text" must be a string'),
    (b'{"texts": []}', 422, "non-empty list"),
    (b'{"texts": ["ok", 1]}', 422, "item 1"),
    (b'["a"]', 422, "JSON object"),
])
def test_bad_bodies_get_a_4xx_naming_the_problem(make_client, clf_spec, body, status, words):
    client, recorder = make_client(clf_spec)
    r = client.post("/serve/clf", content=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert [(e["endpoint"], e["status"]) for e in recorder.events] == [("clf", status)]  # counted as an error


def test_unknown_endpoint_version_and_oversized_body(make_client, clf_spec):
    client, _ = make_client(clf_spec, max_body_bytes=1000)
    r = client.post("/serve/nope", json={"text": "x"})
    assert r.status_code == 404 and "unknown endpoint 'nope'" in r.json()["error"] and "clf" in r.json()["error"]
    r = client.post("/serve/clf/9", json={"text": "x"})
    assert r.status_code == 404 and "version 9" in r.json()["error"]
    r = client.post("/serve/clf/latest", json={"text": "x"})
    assert r.status_code == 404 and "an integer from 1 to 2147483647" in r.json()["error"]
    r = client.post("/serve/clf", json={"text": "x" * 2000})
    assert r.status_code == 413 and "1000 bytes" in r.json()["error"]


def test_endpoint_that_fails_to_load_is_503_and_others_serve(make_client, clf_spec, store, tmp_path, tiny_model):
    broken = endpoint_spec("broken", tiny_model, store, tmp_path,
                           preprocess={"kind": "user", "artifact": "0" * 64, "options": {}})
    client, _ = make_client(clf_spec, broken)
    r = client.post("/serve/broken", json={"text": "x"})
    assert r.status_code == 503 and "failed to load" in r.json()["error"] and r.headers["Retry-After"]
    assert "broken" in client.get("/status").json()["errors"]
    assert client.post("/serve/clf", json={"text": "x"}).status_code == 200
