"""What a Triton user's client does to a worker, with ``tritonclient`` (HTTP and gRPC) against a real
``serving worker`` process: Triton's statistics extension read back equal to the requests sent,
gzip/deflate request bodies (binary and JSON tensors) answered as the plain request is, text sent
over v2 to a tokenizer endpoint answered as ``/serve`` and as onnxruntime on the tokenizer's output,
unknown routes and methods answered in the platform's error body, and an unknown model refused in
Triton's words (its example clients check them).

Two worker processes: requests land on either, and the statistics are the worker's, every process's
counters summed (serving/worker/stats_exchange.py).
"""
from __future__ import annotations

import gzip
import re
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from registry.artifacts import ArtifactStore
from registry.signature import onnx_signature
from tests.serving.worker.grpc_worker import run_worker, tensor_inputs
from tests.serving.worker.support import endpoint_spec, snapshot
from tests.serving.worker.test_serve_rest import direct
from tests.serving.worker.test_v2 import tokens
from tests.support.error_bodies import without_ids

MAX_BODY = 64 * 1024
TEXTS = ["compressed requests travel too", "a second, longer text than the first one is"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_model):
    paths = tmp_path_factory.mktemp("v2-triton-user")
    home = paths / "home"
    store = ArtifactStore(home / "artifacts")
    specs = [endpoint_spec("clf", tiny_model, store, paths),
             endpoint_spec("counted", tiny_model, store, paths, versions=((1, 100.0), (2, 0.0)))]
    for spec in specs:  # as the control plane has it: the vocabulary's limits read from ONNX
        for target in spec["targets"]:
            target["signature"] = onnx_signature(tiny_model.onnx_path)
    with run_worker(home, snapshot(*specs), processes=2, SERVING_MAX_BODY_BYTES=str(MAX_BODY)) as w:
        yield w


@pytest.fixture(scope="module")
def http(worker):
    client = httpclient.InferenceServerClient(worker.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(worker):
    client = grpcclient.InferenceServerClient(worker.grpc)
    yield client
    client.close()


def tensor_inputs(module, feeds: dict[str, np.ndarray], binary: bool = True) -> list:
    inputs = []
    for name, array in feeds.items():
        datatype = "BYTES" if array.dtype == np.object_ else "INT64"
        tensor = module.InferInput(name, list(array.shape), datatype)
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def texts_tensor(texts: list[str]) -> dict[str, np.ndarray]:
    return {"text": np.array([t.encode() for t in texts], dtype=np.object_)}


# --- Triton's statistics extension ---------------------------------------------------------------

def _n(value) -> int:
    """gRPC's JSON writes uint64 as strings and leaves zeros out; HTTP's are numbers."""
    return int(value or 0)


def _counts(stat: dict) -> dict:
    inference = stat.get("inference_stats", {})
    return {"version": stat["version"], "inference_count": _n(stat.get("inference_count")),
            "execution_count": _n(stat.get("execution_count")), "last_inference": _n(stat.get("last_inference")),
            **{f"{k}.{part}": _n(inference.get(k, {}).get(part)) for k in
               ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
               for part in ("count", "ns")}}


def v2_json(feeds: dict[str, np.ndarray]) -> dict:
    return {"inputs": [{"name": k, "datatype": "INT64", "shape": list(v.shape), "data": v.ravel().tolist()}
                       for k, v in feeds.items()]}


@contextmanager
def one_connection_per_process(url: str) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """A keep-alive connection to each of the two processes (the manager hands connections to the
    process holding the fewest, so a few new ones reach both; /status says which process)."""
    clients: dict[int, httpx.Client] = {}
    opened = []
    try:
        while len(clients) < 2 and len(opened) < 8:
            opened.append(httpx.Client(base_url=url))
            clients.setdefault(opened[-1].get("/status").json()["pid"], opened[-1])
        assert len(clients) == 2, "8 connections all reached one worker process"
        yield tuple(clients.values())
    finally:
        for client in opened:
            client.close()


def test_statistics_read_back_equal_to_the_requests_sent(worker, http, grpc, tiny_model):
    """Requests spread over both worker processes (a connection each); either process answers the
    statistics of both."""
    feeds = tokens(tiny_model)
    missing = {k: v for k, v in feeds.items() if k != "attention_mask"}
    started_ms = int(time.time() * 1000)
    with one_connection_per_process(worker.url) as (one, two):
        for connection in (one, two):  # v1 gets every routed request (v2 has weight 0)
            assert connection.post("/v2/models/counted/infer", json=v2_json(feeds)).status_code == 200
            assert connection.post("/v2/models/counted/infer", json=v2_json(missing)).status_code == 400  # failed
            assert connection.post("/v2/models/counted/versions/2/infer", json=v2_json(feeds)).status_code == 200
        assert two.post("/serve/counted", json={"text": TEXTS[0]}).status_code == 200
        assert one.post("/v2/models/counted/infer", content=b"{not json").status_code == 400  # no version to count
    for _ in range(2):
        http.infer("counted", tensor_inputs(httpclient, feeds))
        grpc.infer("counted", tensor_inputs(grpcclient, feeds))
    http.infer("counted", tensor_inputs(httpclient, texts_tensor(TEXTS)))  # text over v2
    with pytest.raises(InferenceServerException, match="missing model input"):
        grpc.infer("counted", tensor_inputs(grpcclient, missing))
    finished_ms = int(time.time() * 1000)

    over_http = http.get_inference_statistics("counted")["model_stats"]
    over_grpc = grpc.get_inference_statistics("counted", as_json=True)["model_stats"]
    assert [_counts(s) for s in over_http] == [_counts(s) for s in over_grpc]
    v1, v2 = (_counts(s) for s in over_http)
    assert [s["name"] for s in over_http] == ["counted", "counted"] and (v1["version"], v2["version"]) == ("1", "2")
    assert (v1["success.count"], v1["fail.count"], v1["inference_count"], v1["execution_count"]) == (8, 3, 8, 8)
    assert (v2["success.count"], v2["fail.count"], v2["inference_count"], v2["execution_count"]) == (2, 0, 2, 2)
    for v in (v1, v2):
        assert started_ms <= v["last_inference"] <= finished_ms
        assert v["success.ns"] >= v["compute_infer.ns"] > 0 and v["queue.count"] == v["success.count"]
        assert v["compute_input.count"] == v["compute_infer.count"] == v["success.count"]
    assert v1["compute_input.ns"] > 0 and v1["fail.ns"] > 0  # /serve and the text were tokenized
    assert v2["compute_input.ns"] == 0  # tensors in: nothing computed before the model

    pinned = http.get_inference_statistics("counted", "2")["model_stats"]
    assert [_counts(s) for s in pinned] == [v2]
    every = {(s["name"], s["version"]) for s in http.get_inference_statistics()["model_stats"]}
    assert every == {("clf", "1"), ("counted", "1"), ("counted", "2")}
    assert "statistics" in http.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        http.get_inference_statistics("nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        grpc.get_inference_statistics("nope")
    with pytest.raises(InferenceServerException, match="does not serve version 3"):
        grpc.get_inference_statistics("counted", "3")


# --- compressed requests -------------------------------------------------------------------------

@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_answer_as_the_plain_request(http, tiny_model, algorithm, binary):
    feeds = tokens(tiny_model, TEXTS[1])
    outputs = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    plain = http.infer("clf", tensor_inputs(httpclient, feeds, binary), outputs=outputs)
    packed = http.infer("clf", tensor_inputs(httpclient, feeds, binary), outputs=outputs,
                        request_compression_algorithm=algorithm)
    assert packed.get_response() == plain.get_response()
    np.testing.assert_array_equal(packed.as_numpy("logits"), plain.as_numpy("logits"))
    np.testing.assert_allclose(packed.as_numpy("logits"), direct(tiny_model, [TEXTS[1]]), atol=1e-4)


def test_raw_deflate_and_serve_take_the_same_encodings(worker, tiny_model):
    """A deflate stream without zlib's header (some clients send it) is taken; /serve shares the code."""
    feeds = tokens(tiny_model, TEXTS[1])
    body = orjson.dumps({"inputs": [{"name": k, "datatype": "INT64", "shape": list(v.shape), "data": v.ravel().tolist()}
                                    for k, v in feeds.items()]})
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    r = httpx.post(f"{worker.url}/v2/models/clf/infer", content=packer.compress(body) + packer.flush(),
                   headers={"Content-Encoding": "deflate"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["outputs"][0]["data"], direct(tiny_model, [TEXTS[1]]).ravel(), atol=1e-4)
    served = httpx.post(f"{worker.url}/serve/clf", content=zlib.compress(orjson.dumps({"text": TEXTS[1]})),
                        headers={"Content-Encoding": "deflate", "Content-Type": "application/json"})
    assert served.status_code == 200 and served.json() == httpx.post(f"{worker.url}/serve/clf",
                                                                      json={"text": TEXTS[1]}).json()


def test_compressed_grpc_request(grpc, tiny_model):
    feeds = tokens(tiny_model, TEXTS[1])
    packed = grpc.infer("clf", tensor_inputs(grpcclient, feeds), compression_algorithm="gzip")
    np.testing.assert_allclose(packed.as_numpy("logits"), direct(tiny_model, [TEXTS[1]]), atol=1e-4)


def test_a_body_that_inflates_past_the_limit_is_413(worker):
    bomb = b'{"inputs": [{"name": "input_ids", "data": [' + b"0, " * MAX_BODY + b'0]}]}'
    for encoding, packed in (("gzip", gzip.compress(bomb)), ("deflate", zlib.compress(bomb))):
        assert len(packed) < MAX_BODY // 16  # small on the wire, over the limit unpacked
        r = httpx.post(f"{worker.url}/v2/models/clf/infer", content=packed, headers={"Content-Encoding": encoding})
        assert r.status_code == 413 and without_ids(r) == {
            "error": f"{encoding} body unpacks to over the limit of {MAX_BODY} bytes"}, r.text
    r = httpx.post(f"{worker.url}/v2/models/clf/infer", content=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
    r = httpx.post(f"{worker.url}/v2/models/clf/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 415 and "use gzip or deflate" in r.json()["error"]


# --- text over v2 --------------------------------------------------------------------------------

def test_text_over_v2_equals_serve_and_onnxruntime(worker, http, grpc, tiny_model):
    served = httpx.post(f"{worker.url}/serve/clf", json={"texts": TEXTS}).json()["predictions"]
    expected = direct(tiny_model, TEXTS)
    meta = http.get_model_metadata("clf")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in meta["outputs"]] == ["label", "score", "logits"]
    assert [i["name"] for i in grpc.get_model_metadata("clf", as_json=True)["inputs"]] == ["text"]
    answers = [http.infer("clf", tensor_inputs(httpclient, texts_tensor(TEXTS), binary))
               for binary in (True, False)]
    answers.append(grpc.infer("clf", tensor_inputs(grpcclient, texts_tensor(TEXTS))))
    for answer in answers:
        assert [b.decode() for b in answer.as_numpy("label")] == [p["label"] for p in served]
        np.testing.assert_array_equal(answer.as_numpy("score"), np.float32([p["score"] for p in served]))
        np.testing.assert_array_equal(answer.as_numpy("logits"), np.float32([p["logits"] for p in served]))
        np.testing.assert_allclose(answer.as_numpy("logits"), expected, atol=1e-4)
    tensors = http.infer("clf", tensor_inputs(httpclient, tokens(tiny_model, TEXTS[0])))  # the model's own inputs
    np.testing.assert_allclose(tensors.as_numpy("logits"), direct(tiny_model, [TEXTS[0]]), atol=1e-4)
    with pytest.raises(InferenceServerException, match="element 0 is not UTF-8"):
        http.infer("clf", tensor_inputs(httpclient, {"text": np.array([b"\xff\xfe"], dtype=np.object_)}))


# --- the platform's error body on routes and methods ---------------------------------------------

def test_an_unknown_model_is_refused_in_tritons_words_then_ours(worker, http, grpc, tiny_model):
    """Triton's example clients (simple_http_infer_client.py and its aio twin) check that the error for an
    unknown model starts with ``Request for unknown model``; the endpoints we serve follow. /serve keeps the
    platform's own wording."""
    want = "Request for unknown model: 'wrong_model_name' is not found (endpoints: clf, counted)"
    feeds = tensor_inputs(httpclient, {k: v[:1] for k, v in tokens(tiny_model, TEXTS).items()})
    calls = {"http infer": lambda: http.infer("wrong_model_name", feeds),
             "http metadata": lambda: http.get_model_metadata("wrong_model_name"),
             "grpc infer": lambda: grpc.infer("wrong_model_name", tensor_inputs(grpcclient, {
                 k: v[:1] for k, v in tokens(tiny_model, TEXTS).items()})),
             "grpc metadata": lambda: grpc.get_model_metadata("wrong_model_name")}
    for name, call in calls.items():
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.message().startswith(want), (name, info.value.message())
    assert http.is_model_ready("wrong_model_name") is False
    r = httpx.get(f"{worker.url}/v2/models/wrong_model_name/ready")
    assert r.status_code == 404 and without_ids(r) == {"error": want}
    r = httpx.post(f"{worker.url}/v2/models/wrong_model_name/infer",
                   json={"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]})
    assert r.status_code == 404 and without_ids(r) == {"error": want}
    r = httpx.post(f"{worker.url}/serve/wrong_model_name", json={"text": "x"})
    assert r.status_code == 404 and r.json()["error"].startswith("unknown endpoint 'wrong_model_name'")


def test_unknown_routes_and_methods_answer_the_platform_error_body(worker):
    cases = [("GET", "/v2/nothing/here", 404, None), ("PUT", "/v2/models/clf/infer", 405, "POST"),
             ("GET", "/serve/clf", 405, "POST"), ("DELETE", "/status", 405, "GET")]
    for method, path, status, allow in cases:
        r = httpx.request(method, f"{worker.url}{path}")
        assert r.status_code == status and list(without_ids(r)) == ["error"] and path in r.json()["error"], r.text
        assert r.headers.get("allow") == allow


def test_the_docs_text_example_runs_as_written(worker, capsys):
    """docs/serving.md's text-over-v2 example, pointed at this worker and its endpoint."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "serving.md").read_text()
    section = text[text.index("### Text over v2"):]
    (block,) = re.findall(r"^```python\n(.*?)^```$", section[:section.index("\n### ", 5)], re.M | re.S)
    exec(block.replace("localhost:9090", worker.url.removeprefix("http://")).replace('"sentiment"', '"clf"'), {})
    out = capsys.readouterr().out
    assert out.count("LABEL") + out.count("POSITIVE") + out.count("NEGATIVE") >= 2, out
