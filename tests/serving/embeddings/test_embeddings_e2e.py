"""Encoder endpoints end to end in one worker on a real socket (onnxruntime engine), called with the stock
clients (``openai``'s ``embeddings.create``, ``huggingface_hub``'s ``InferenceClient``) and plain HTTP on
TEI's routes, every answer compared with sentence-transformers run on the same folder: embeddings with
``SentenceTransformer.encode`` (cosine >= 0.99999, max |diff| <= 1e-5, float32), rerank scores with
``CrossEncoder.predict``. Models: random-weight BERTs in sentence-transformers folder layout, built and
exported by the platform's own exporter once for the module (tests/serving/encoders.py). Also: errors in
each protocol's shape, a 256-text request split by the token batcher and joined in order, canary and
shadow routing (agreement as cosine similarity), client keys with a token budget, the statistics event."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from preprocess.loader import pack_directory
from preprocess.pooling import normalize
from preprocess.sentence_folder import read_folder
from registry.artifacts import ArtifactStore
from registry.signature import onnx_signature
from serving.credentials import secret_sha256
from serving.embeddings.export import export
from serving.worker.app import create_app
from tests.serving.encoders import (SENTENCES, build_cross_encoder_folder, build_sentence_folder, st_encode,
                                    st_rerank)
from tests.serving.worker.conftest import ListRecorder
from tests.serving.worker.support import snapshot, store_bytes, worker_settings
from tests.support.ci import require_module
from tests.support.procs import wait_until
from tests.support.servers import serve_in_thread
from tests.support.error_bodies import without_ids

openai = require_module("openai")
TEXTS_256 = [f"{SENTENCES[i % len(SENTENCES)]} (variant {i}{' more words' * (i % 13)})" for i in range(256)]
QUERY = "which text is about music?"


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float32), np.asarray(expected, dtype=np.float32)
    assert got.shape == expected.shape
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert float(np.min(cosine)) >= 0.99999
    assert float(np.max(np.abs(got - expected))) <= 1e-5


class Models:
    def __init__(self, root: Path) -> None:
        self.mean = build_sentence_folder(root / "mean")  # 2.x pooling config, mean, normalized
        self.cls = build_sentence_folder(root / "cls", pooling="cls", normalize=False, legacy=False)
        self.other = build_sentence_folder(root / "other", seed=1)  # another model: the canary, the shadow
        self.cross = build_cross_encoder_folder(root / "cross")
        self.onnx = {name: export(folder, root / f"{name}.onnx", read_folder(folder).task).path
                     for name, folder in (("mean", self.mean), ("cls", self.cls), ("other", self.other),
                                          ("cross", self.cross))}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("encoders"))


@pytest.fixture(scope="module")
def references(models) -> dict:
    return {"mean": st_encode(models.mean, SENTENCES), "cls": st_encode(models.cls, TEXTS_256),
            "other": st_encode(models.other, SENTENCES), "rerank": st_rerank(models.cross, QUERY, SENTENCES)}


def _spec(store: ArtifactStore, tmp: Path, name: str, folder: Path, onnx: list[tuple[Path, float, str]],
          options: dict | None = None) -> dict:
    tokenizer = store_bytes(store, pack_directory(folder), tmp, f"{name}.tar.gz")
    targets = [{"model": name, "version": v, "weight": w, "role": role, "triton_name": f"{name}_v{v}",
                "artifact": store.put_file(path)[0], "framework": "onnx", "signature": onnx_signature(path)}
               for v, (path, w, role) in enumerate(onnx, start=1)]
    options = options if options is not None else read_folder(folder).options()
    return {"name": name, "engine": "onnxruntime", "preprocess": {"kind": "tokenizer", "artifact": tokenizer,
                                                                  "options": options},
            "targets": targets, "metrics": [], "log_freq": 1.0, "batching": {"max_batch_size": 32}}


def _snapshot(models: Models, home: Path, only: tuple[str, ...] = (), **extra) -> dict:
    store = ArtifactStore(home / "artifacts")
    onnx = models.onnx
    specs = (
        _spec(store, home, "emb", models.mean, [(onnx["mean"], 100.0, "stable")]),
        _spec(store, home, "emb-cls", models.cls, [(onnx["cls"], 100.0, "stable")],
              {**read_folder(models.cls).options(), "max_batch_tokens": 256}),
        _spec(store, home, "emb-canary", models.mean, [(onnx["mean"], 50.0, "stable"), (onnx["other"], 50.0, "canary")]),
        _spec(store, home, "emb-shadow", models.mean, [(onnx["mean"], 100.0, "stable"), (onnx["other"], 100.0, "shadow")]),
        _spec(store, home, "rank", models.cross, [(onnx["cross"], 100.0, "stable")]),
        _spec(store, home, "clf", models.cross, [(onnx["cross"], 100.0, "stable")], {"max_length": 128}),
    )
    return {**snapshot(*(s for s in specs if not only or s["name"] in only)), **extra}


@pytest.fixture(scope="module")
def worker(models, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    recorder = ListRecorder()
    app = create_app(worker_settings(home), snapshot=_snapshot(models, home), recorder=recorder)
    with serve_in_thread(app) as url:
        yield url, recorder, app.state.dataplane


@pytest.fixture(scope="module")
def client(worker):
    return openai.OpenAI(api_key="-", base_url=f"{worker[0]}/serve/openai/v1", max_retries=0)


def _tokens(folder: Path, texts: list[str]) -> int:
    from transformers import AutoTokenizer

    return int(sum(len(ids) for ids in AutoTokenizer.from_pretrained(str(folder))(texts, truncation=True,
                                                                                 max_length=128)["input_ids"]))


# --- OpenAI's API ---------------------------------------------------------------------------------

def test_openai_client_embeddings_equal_sentence_transformers(client, models, references):
    got = client.embeddings.create(model="emb", input=SENTENCES)  # the client asks for base64 and decodes it
    assert [d.index for d in got.data] == list(range(len(SENTENCES))) and got.model == "emb"
    assert_same([d.embedding for d in got.data], references["mean"])
    assert got.usage.prompt_tokens == got.usage.total_tokens == _tokens(models.mean, SENTENCES)
    floats = client.embeddings.create(model="emb", input=SENTENCES, encoding_format="float")
    assert_same([d.embedding for d in floats.data], references["mean"])
    one = client.embeddings.create(model="emb", input=SENTENCES[2])
    assert_same([one.data[0].embedding], references["mean"][2:3])


def test_token_ids_and_dimensions(client, models, references):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(models.mean))(SENTENCES[:3])["input_ids"]
    got = client.embeddings.create(model="emb", input=ids)
    assert_same([d.embedding for d in got.data], references["mean"][:3])
    assert got.usage.prompt_tokens == sum(len(i) for i in ids)
    single = client.embeddings.create(model="emb", input=ids[1])
    assert_same([single.data[0].embedding], references["mean"][1:2])
    short = client.embeddings.create(model="emb", input=SENTENCES, dimensions=8)  # Matryoshka: cut, renormalized
    assert_same([d.embedding for d in short.data], normalize(references["mean"][:, :8]))


def test_models_lists_encoder_endpoints(client):
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {"emb", "emb-cls", "emb-canary", "emb-shadow", "rank"}  # not the classifier
    assert listed["emb"].model_extra["task"] == "embed" and listed["rank"].model_extra["task"] == "rerank"
    assert listed["emb"].model_extra["max_model_len"] == 128
    assert client.models.retrieve("emb").id == "emb"


@pytest.mark.parametrize("kwargs, kind, param, code", [
    ({"model": "emb", "input": ""}, "BadRequestError", "input", None),
    ({"model": "emb", "input": "word " * 200}, "BadRequestError", "input", "context_length_exceeded"),
    ({"model": "emb", "input": [[101, 999999, 102]]}, "UnprocessableEntityError", None, None),
    ({"model": "emb", "input": "x", "dimensions": 999}, "UnprocessableEntityError", None, None),
    ({"model": "nope", "input": "x"}, "NotFoundError", None, "model_not_found"),
    ({"model": "clf", "input": "x"}, "BadRequestError", "model", "model_not_supported"),
    ({"model": "rank", "input": "x"}, "BadRequestError", "model", "model_not_supported"),
])
def test_openai_errors(client, kwargs, kind, param, code):
    with pytest.raises(getattr(openai, kind)) as info:
        client.embeddings.create(**kwargs)
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param and (code is None or error["code"] == code)


def test_a_256_text_request_is_batched_by_tokens_and_joined_in_order(client, references, worker):
    _, recorder, _ = worker
    got = client.embeddings.create(model="emb-cls", input=TEXTS_256, encoding_format="float")
    assert_same([d.embedding for d in got.data], references["cls"])  # cls pooling, not normalized
    event = [e for e in recorder.events if e["endpoint"] == "emb-cls" and e.get("embedding")][-1]
    counts = event["embedding"]
    assert counts["inputs"] == 256 and counts["tokens"] == got.usage.prompt_tokens
    assert sum(counts["batches"]) == 256 and len(counts["batches"]) > 8  # 256 tokens a call at most


# --- TEI's API ------------------------------------------------------------------------------------

def test_tei_embed_rerank_tokenize(worker, models, references):
    url = worker[0]
    embed = httpx.post(f"{url}/serve/tei/emb/embed", json={"inputs": SENTENCES}, timeout=30)
    assert embed.status_code == 200 and embed.headers["x-model-version"] == "1"
    assert_same(embed.json(), references["mean"])
    raw = httpx.post(f"{url}/serve/tei/emb-cls/embed", json={"inputs": TEXTS_256[0], "normalize": False}, timeout=30)
    assert_same(raw.json(), references["cls"][:1])
    ranked = httpx.post(f"{url}/serve/tei/rank/rerank", json={"query": QUERY, "texts": SENTENCES, "return_text": True},
                        timeout=30).json()
    expected = references["rerank"]
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    for r in ranked:
        assert abs(r["score"] - float(expected[r["index"]])) <= 1e-5 and r["text"] == SENTENCES[r["index"]]
    logits = httpx.post(f"{url}/serve/tei/rank/rerank", json={"query": QUERY, "texts": SENTENCES[:2],
                                                               "raw_scores": True}, timeout=30).json()
    for r in logits:
        assert abs(1 / (1 + np.exp(-r["score"])) - expected[r["index"]]) <= 1e-5 and "text" not in r
    tokens = httpx.post(f"{url}/serve/tei/emb/tokenize", json={"inputs": ["hello world"]}, timeout=30).json()
    assert [(t["id"], t["text"], t["special"]) for t in tokens[0]] == [
        (101, "[CLS]", True), (7592, "hello", False), (2088, "world", False), (102, "[SEP]", True)]
    assert (tokens[0][2]["start"], tokens[0][2]["stop"]) == (6, 11)
    info = httpx.get(f"{url}/serve/tei/rank/info", timeout=30).json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert httpx.get(f"{url}/serve/tei/emb/health", timeout=30).status_code == 200


def test_huggingface_hub_inference_client_works_unchanged(worker, references):
    from huggingface_hub import InferenceClient

    hub = InferenceClient(model=f"{worker[0]}/serve/tei/emb")
    assert_same(hub.feature_extraction(SENTENCES[0]), references["mean"][:1])
    assert_same(hub.feature_extraction(SENTENCES[1], normalize=True, truncate=True), references["mean"][1:2])


@pytest.mark.parametrize("path, body, status, kind", [
    ("emb/embed", {"inputs": []}, 400, "Empty"),
    ("emb/embed", {"inputs": "word " * 200}, 413, "Validation"),
    ("emb/embed", {"inputs": ["x"] * 2049}, 413, "Validation"),
    ("emb/embed", {"text": "x"}, 422, "Validation"),
    ("emb/embed", {"inputs": "x", "normalize": "yes"}, 422, "Validation"),
    ("emb/rerank", {"query": "q", "texts": ["x"]}, 404, "Validation"),
    ("rank/rerank", {"texts": ["x"]}, 422, "Validation"),
    ("nope/embed", {"inputs": "x"}, 404, "Validation"),
    ("emb/embed_all", {"inputs": "x"}, 404, "Validation"),
])
def test_tei_errors(worker, path, body, status, kind):
    answer = httpx.post(f"{worker[0]}/serve/tei/{path}", json=body, timeout=30)
    assert answer.status_code == status
    assert set(without_ids(answer)) == {"error", "error_type"} and answer.json()["error_type"] == kind


def test_serve_answers_embeddings_too(worker, references):
    one = httpx.post(f"{worker[0]}/serve/emb", json={"text": SENTENCES[0]}, timeout=30).json()
    assert_same([one["embedding"]], references["mean"][:1])
    scores = httpx.post(f"{worker[0]}/serve/rank", json={"query": QUERY, "texts": SENTENCES}, timeout=30).json()
    np.testing.assert_allclose(scores["scores"], references["rerank"], rtol=0, atol=1e-5)


# --- rollouts and statistics ------------------------------------------------------------------------

def test_canary_answers_are_each_versions_own(worker, references):
    seen = set()
    for i in range(12):  # sticky routing keys: the same versions every run
        answer = httpx.post(f"{worker[0]}/serve/openai/v1/embeddings", json={"model": "emb-canary", "input": SENTENCES,
                                                                              "encoding_format": "float"},
                            headers={"X-Routing-Key": f"user-{i}"}, timeout=30)
        version = answer.headers["x-model-version"]
        seen.add(version)
        assert_same([d["embedding"] for d in answer.json()["data"]], references["mean" if version == "1" else "other"])
    assert seen == {"1", "2"}


def test_shadow_copies_are_compared_by_cosine(worker):
    url, recorder, dataplane = worker
    answer = httpx.post(f"{url}/serve/tei/emb-shadow/embed", json={"inputs": SENTENCES}, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-model-version"] == "1"
    copies = wait_until(lambda: [e for e in recorder.events if e["endpoint"] == "emb-shadow" and "shadow" in e],
                        what="the shadow copy's event")
    shadow = copies[0]["shadow"]
    assert copies[0]["version"] == 2 and copies[0]["status"] == 200 and shadow["live_version"] == 1
    assert -1.0 <= shadow["cosine"] < 0.99 and shadow["agree"] is False  # another model's vectors
    assert dataplane.shadow.sent >= 1


def test_the_event_counts_inputs_tokens_and_batches(client, worker, models):
    _, recorder, _ = worker
    before = len(recorder.events)
    got = client.embeddings.create(model="emb", input=SENTENCES[:3])
    event = next(e for e in recorder.events[before:] if e["endpoint"] == "emb")
    assert event["status"] == 200 and event["version"] == 1
    counts = event["embedding"]
    assert (counts["task"], counts["inputs"], counts["tokens"]) == ("embed", 3, got.usage.prompt_tokens)
    assert sum(counts["batches"]) == 3  # shared out over the engine's free slots
    assert event["custom"] == {"tokens": got.usage.prompt_tokens, "inputs": 3}


def test_client_keys_scopes_and_token_budgets(models, tmp_path):
    keys = {"alice": {"sha256": secret_sha256("sk-alice"), "endpoints": ["emb"], "rate": None,
                      "tokens_per_minute": 40},
            "bob": {"sha256": secret_sha256("sk-bob"), "endpoints": ["rank"], "rate": None}}
    app = create_app(worker_settings(tmp_path, client_keys_required=True),
                     snapshot=_snapshot(models, tmp_path, ("emb", "rank"), client_keys=keys), recorder=ListRecorder())
    with serve_in_thread(app) as url:
        base = f"{url}/serve/openai/v1"
        alice = openai.OpenAI(api_key="sk-alice", base_url=base, max_retries=0)
        first = alice.embeddings.create(model="emb", input=SENTENCES)  # more than 40 tokens: charged after
        assert first.usage.prompt_tokens > 40
        with pytest.raises(openai.RateLimitError):
            alice.embeddings.create(model="emb", input="again")
        with pytest.raises(openai.PermissionDeniedError):
            openai.OpenAI(api_key="sk-bob", base_url=base, max_retries=0).embeddings.create(model="emb", input="x")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(api_key="sk-nobody", base_url=base, max_retries=0).embeddings.create(model="emb", input="x")
        assert [m.id for m in openai.OpenAI(api_key="sk-bob", base_url=base).models.list().data] == ["rank"]
        tei = httpx.post(f"{url}/serve/tei/emb/embed", json={"inputs": "x"},
                         headers={"Authorization": "Bearer sk-bob"}, timeout=30)
        assert tei.status_code == 403 and json.loads(tei.text)["error_type"] == "Validation"
        bob = httpx.post(f"{url}/serve/tei/rank/rerank", json={"query": "q", "texts": ["a"]},
                         headers={"Authorization": "Bearer sk-bob"}, timeout=30)
        assert bob.status_code == 200
