"""Shadow traffic in one worker: copies go to the shadow version, answers never come from it."""
from __future__ import annotations

import random
import time

import numpy as np
import onnxruntime as ort
import pytest
from transformers import AutoTokenizer

from serving.statistics.events import parse_event
from serving.worker import canary_split
from serving.worker.runtime import Target
from serving.worker.shadow import compare, compare_tensors, mean_abs_diff

TEXTS = ["fine", "the staff were friendly and quick", "an awful slow and noisy place", "calm"]


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    from serving.testmodels import build_bert_classifier

    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-shadow"), seed=1)


def logits_of(bundle, texts: list[str]) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0]


def shadow_spec(clf_spec: dict, store, bundle, percent: float) -> dict:
    live = clf_spec["targets"][0]
    shadow = {**live, "version": 2, "weight": percent, "role": "shadow", "triton_name": "clf_v2",
              "artifact": store.put_file(bundle.onnx_path)[0]}
    return {**clf_spec, "targets": [shadow, live]}  # shadow first: order must not matter


def wait_events(recorder, count: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shadows = [e for e in recorder.events if "shadow" in e]
        if len(shadows) >= count:
            return shadows
        time.sleep(0.02)
    raise AssertionError(f"{len([e for e in recorder.events if 'shadow' in e])} shadow events, wanted {count}")


def test_choose_never_picks_a_shadow():
    live = Target("m", 1, 10.0, "m_v1", "", (), ())
    shadow = Target("m", 2, 100.0, "m_v2", "", (), (), role="shadow")
    rng = random.Random(3)
    assert {canary_split.choose([shadow, live], [100.0, 10.0], rand=rng.random) for _ in range(500)} == {live}
    assert canary_split.choose([shadow, live], [0.0, 0.0]) is live  # no weight at all: still a live one
    assert {canary_split.choose([shadow, live], [100.0, 10.0], key=f"u{i}") for i in range(200)} == {live}


def test_compare_answers():
    a = {"label": "POSITIVE", "score": 0.9, "logits": [-1.0, 1.0]}
    b = {"label": "POSITIVE", "score": 0.8, "logits": [-0.5, 0.5]}
    assert compare(a, b) == (True, 0.5)
    assert compare(a, {**b, "label": "NEGATIVE"})[0] is False
    batch = {"predictions": [a, a]}
    assert compare(batch, {"predictions": [a, b]}) == (True, 0.25)
    assert compare({"y": [1, 2, 3]}, {"y": [1, 2, 3]}) == (True, 0.0)
    assert compare({"y": [1, 2, 3]}, {"y": [1, 2, 4]}) == (False, pytest.approx(1 / 3))
    assert compare("cat", "dog") == (False, None)
    assert mean_abs_diff([1, 2], [1, 2, 3]) is None
    x = {"logits": np.array([[0.0, 2.0], [1.0, 0.0]], np.float32)}
    assert compare_tensors(x, {"logits": np.array([[0.5, 2.0], [1.0, 0.5]], np.float32)}) == (True, 0.25)
    assert compare_tensors(x, {"logits": np.array([[2.0, 0.0], [1.0, 0.0]], np.float32)})[0] is False


def test_copies_go_to_the_shadow_and_answers_stay_live(make_client, clf_spec, store, tiny_model, second_model):
    client, recorder = make_client(shadow_spec(clf_spec, store, second_model, 100.0))
    live, other = logits_of(tiny_model, TEXTS), logits_of(second_model, TEXTS)
    assert np.abs(live - other).mean() > 1e-3  # two different models, or the test proves nothing
    for i, text in enumerate(TEXTS * 3):
        r = client.post("/serve/clf", json={"text": text})
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "1"
        np.testing.assert_allclose(r.json()["logits"], live[i % len(TEXTS)], atol=1e-4)
    shadows = wait_events(recorder, 12)
    live_events = [e for e in recorder.events if "shadow" not in e]
    assert len(live_events) == 12 and {e["version"] for e in live_events} == {1}
    assert len(shadows) == 12 and {e["version"] for e in shadows} == {2} and {e["status"] for e in shadows} == {200}
    # copies run in the background, side by side: they may finish out of order, so each text's
    # comparison must be among them, as often as the text was sent
    expected = sorted((float(np.abs(live[i % len(TEXTS)] - other[i % len(TEXTS)]).mean()),
                       bool(np.argmax(live[i % len(TEXTS)]) == np.argmax(other[i % len(TEXTS)]))) for i in range(12))
    parsed = sorted((parse_event(event) for event in shadows), key=lambda p: p.shadow.mad)
    for got, (mad, agree) in zip(parsed, expected):
        assert got.shadow.live_version == 1 and not got.shadow.dropped
        assert got.shadow.mad == pytest.approx(mad, abs=1e-4) and got.shadow.agree == agree
    assert all(set(event["stages"]) == {"preprocess", "inference", "postprocess"} for event in shadows)
    # a pinned request is the client's explicit choice: no copy; the shadow version answers it
    assert client.post("/serve/clf/2", json={"text": "fine"}).headers["X-Model-Version"] == "2"
    # v2 tensors are copied too
    tok = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))
    enc = tok(["fine"], return_tensors="np")
    body = {"inputs": [{"name": n, "shape": list(enc[n].shape), "datatype": "INT64", "data": enc[n].ravel().tolist()}
                       for n in ("input_ids", "attention_mask", "token_type_ids")]}
    assert client.post("/v2/models/clf/infer", json=body).status_code == 200
    last = wait_events(recorder, 13)[-1]
    assert last["version"] == 2 and last["shadow"]["mad"] == pytest.approx(np.abs(live[0] - other[0]).mean(), abs=1e-4)


def test_partial_share_and_drops(make_client, clf_spec, store, second_model):
    client, recorder = make_client(shadow_spec(clf_spec, store, second_model, 30.0))
    mirror = client.app.state.dataplane.shadow
    n = 200
    for i in range(n):
        assert client.post("/serve/clf", json={"text": TEXTS[i % 4]}).headers["X-Model-Version"] == "1"
    copies = len(wait_events(recorder, 1))
    time.sleep(0.5)
    copies = len([e for e in recorder.events if "shadow" in e])
    assert abs(copies - 0.3 * n) <= 4.5 * (n * 0.3 * 0.7) ** 0.5, copies  # binomial, 4.5 sigma
    # no room for a copy (the shadow is too slow): dropped and recorded as dropped, never queued
    mirror.max_in_flight, mirror.rand = 0, lambda: 0.0
    before = len(recorder.events)
    assert client.post("/serve/clf", json={"text": "fine"}).headers["X-Model-Version"] == "1"
    dropped = [e for e in recorder.events[before:] if "shadow" in e]
    assert mirror.dropped == 1 and len(dropped) == 1 and dropped[0]["shadow"]["dropped"] is True
    assert parse_event(dropped[0]).shadow.dropped


def test_embeddings_agree_by_cosine_and_rerank_scores_by_order():
    from serving.worker.shadow import compare, embedding_cosine

    live = {"embeddings": np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32), "tokens": [3, 4]}
    close = {"embeddings": np.array([[0.999, 0.01], [0.6, 0.8]], dtype=np.float32), "tokens": [3, 4]}
    far = {"embeddings": np.array([[0.0, 1.0], [0.6, 0.8]], dtype=np.float32), "tokens": [3, 4]}
    assert embedding_cosine(live, live) == pytest.approx(1.0) and compare(live, close)[0] is True
    assert embedding_cosine(live, far) == pytest.approx(0.0, abs=1e-7) and compare(live, far)[0] is False
    assert embedding_cosine({"embedding": [1.0, 0.0]}, {"embedding": [1.0, 0.0, 0.0]}) is None  # other dimensions
    assert embedding_cosine({"label": "A"}, {"label": "A"}) is None
    assert compare({"scores": [0.9, 0.1, 0.5]}, {"scores": [0.8, 0.2, 0.6]}) == (True, pytest.approx(0.1))
    assert compare({"scores": [0.9, 0.1, 0.5]}, {"scores": [0.1, 0.9, 0.5]})[0] is False
