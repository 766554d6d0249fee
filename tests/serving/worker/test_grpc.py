"""The v2 protocol over gRPC, with NVIDIA's own clients against a real 2-process `serving worker`.

Answers are compared with onnxruntime run directly on the same tensors; canary shares are held to
a stated binomial bound; every error is a status code a client can act on, with a message naming
what is wrong.
"""
from __future__ import annotations

import asyncio
import math
import re

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from registry.artifacts import ArtifactStore
from registry.signature import onnx_signature
from tests.serving.worker.grpc_worker import (ort_direct, run_worker, tensor_feeds, tensor_inputs, tensor_model,
                                              tensor_spec)
from tests.serving.worker.support import endpoint_spec, snapshot
from tests.serving.worker.test_serve_rest import direct
from tests.serving.worker.test_v2 import TEXT, tokens

CANARY_SHARE, CANARY_CALLS = 0.3, 600
MAX_BODY = 262_144


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return tmp_path_factory.mktemp("grpc")


@pytest.fixture(scope="module")
def model_path(paths):
    return tensor_model(paths / "tensors.onnx")


@pytest.fixture(scope="module")
def worker(paths, tiny_model, model_path):
    home = paths / "home"
    store = ArtifactStore(home / "artifacts")
    clf = endpoint_spec("clf", tiny_model, store, paths)
    for target in clf["targets"]:  # as the control plane has it: with the vocabulary's limits read from ONNX
        target["signature"] = onnx_signature(tiny_model.onnx_path)
    specs = [clf,
             tensor_spec("tensors", model_path, store),
             tensor_spec("canary", model_path, store, versions=((1, 100 * (1 - CANARY_SHARE)),
                                                                (2, 100 * CANARY_SHARE))),
             {**endpoint_spec("gone", tiny_model, store, paths), "engine": "triton"}]  # no Triton there
    with run_worker(home, snapshot(*specs), processes=2, SERVING_MAX_BODY_BYTES=str(MAX_BODY)) as w:
        yield w


@pytest.fixture
def client(worker):
    c = grpcclient.InferenceServerClient(worker.grpc)
    yield c
    c.close()


def test_sync_client_on_a_tokenizer_endpoint_matches_onnxruntime(client, tiny_model):
    result = client.infer("clf", tensor_inputs(grpcclient, tokens(tiny_model)),
                          outputs=[grpcclient.InferRequestedOutput("logits")], request_id="r-1")
    np.testing.assert_allclose(result.as_numpy("logits"), direct(tiny_model, [TEXT]), atol=1e-4)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("clf", "1", "r-1")


def test_aio_client_on_a_raw_tensor_endpoint_several_inputs_and_outputs_bytes(worker, model_path):
    feeds = tensor_feeds()

    async def call():
        async with aioclient.InferenceServerClient(worker.grpc) as c:
            return await c.infer("tensors", tensor_inputs(aioclient, feeds))

    result = asyncio.run(call())
    y, n, t = ort_direct(model_path, feeds, ["y", "n", "t"])
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert result.as_numpy("n").item() == n.item() == 6
    assert [v.decode() for v in result.as_numpy("t").tolist()] == t.tolist() == ["café", "naïve 東京"]
    assert [o.name for o in result.get_response().outputs] == ["y", "n", "t"]  # no outputs asked: all


def test_typed_contents_as_well_as_raw(worker, model_path, tiny_model):
    """tritonclient sends raw_input_contents; other clients (KServe's) send typed contents."""
    feeds = tensor_feeds()
    request = service_pb2.ModelInferRequest(model_name="tensors", model_version="1")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 3]).contents.fp32_contents.extend(feeds["x"].ravel())
    request.inputs.add(name="s", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(feeds["s"].tolist())
    request.outputs.add(name="t")
    request.outputs.add(name="y")
    with grpc.insecure_channel(worker.grpc) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        ids = tokens(tiny_model)
        clf = service_pb2.ModelInferRequest(model_name="clf")
        for name, array in ids.items():
            clf.inputs.add(name=name, datatype="INT64", shape=list(array.shape)).contents.int64_contents.extend(
                array.ravel().tolist())
        logits = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(clf, timeout=30)
    result = grpcclient.InferResult(response)
    y, t = ort_direct(model_path, feeds, ["y", "t"])
    assert [o.name for o in response.outputs] == ["t", "y"] and response.model_version == "1"
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert [v.decode() for v in result.as_numpy("t").tolist()] == t.tolist()
    np.testing.assert_allclose(grpcclient.InferResult(logits).as_numpy("logits"), direct(tiny_model, [TEXT]),
                               atol=1e-4)


def test_health_metadata_config_and_index_match_the_model(client, model_path):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tensors") and client.is_model_ready("tensors", "1")
    assert client.get_server_metadata(as_json=True)["name"] == "serving"
    meta = client.get_model_metadata("tensors", as_json=True)
    signature = onnx_signature(model_path)
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"  # Triton's name, not the engine's
    assert client.get_model_metadata("gone", as_json=True)["platform"] == "onnxruntime_onnx"  # engine triton, ONNX
    for got, want in ((meta["inputs"], signature["inputs"]), (meta["outputs"], signature["outputs"])):
        assert [(t["name"], t["datatype"], [int(d) for d in t.get("shape", [])]) for t in got] == \
               [(t["name"], t["dtype"], t["shape"]) for t in want]
    config = client.get_model_config("tensors", as_json=True)["config"]
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert [(i["name"], i["data_type"]) for i in config["input"]] == [("x", "TYPE_FP32"), ("s", "TYPE_STRING")]
    assert [o["name"] for o in config["output"]] == ["y", "n", "t"]
    index = client.get_model_repository_index(as_json=True)["models"]
    states = {(m["name"], m["version"]): m["state"] for m in index}
    assert states[("tensors", "1")] == "READY" and states[("canary", "2")] == "READY"
    assert states[("gone", "1")] == "UNAVAILABLE"
    assert not client.is_model_ready("gone")


def test_canary_shares_routing_key_and_pinned_version(client):
    feeds = tensor_feeds()
    inputs = tensor_inputs(grpcclient, feeds)
    versions = [client.infer("canary", inputs).get_response().model_version for _ in range(CANARY_CALLS)]
    canary = versions.count("2")
    sigma = math.sqrt(CANARY_CALLS * CANARY_SHARE * (1 - CANARY_SHARE))
    # 4.5 sigma: a correct router fails this about once in 150,000 runs
    assert abs(canary - CANARY_CALLS * CANARY_SHARE) <= 4.5 * sigma, (canary, CANARY_CALLS)
    for key in ("user-1", "user-2", "user-3"):
        sticky = {client.infer("canary", inputs, headers={"x-routing-key": key}).get_response().model_version
                  for _ in range(15)}
        assert len(sticky) == 1, (key, sticky)
    assert {client.infer("canary", inputs, model_version="2").get_response().model_version for _ in range(10)} == {"2"}


def expect(call, code: str, *words: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == f"StatusCode.{code}", (info.value.status(), info.value.message())
    for w in words:
        assert w in info.value.message(), (w, info.value.message())
    assert "Traceback" not in info.value.message()
    return info.value


def test_not_found_and_invalid_argument_name_what_is_wrong(client, tiny_model):
    good = tensor_inputs(grpcclient, tensor_feeds())
    expect(lambda: client.infer("nope", good), "NOT_FOUND", "Request for unknown model: 'nope' is not found", "tensors")
    expect(lambda: client.infer("tensors", good, model_version="9"), "NOT_FOUND", "version 9")
    expect(lambda: client.get_model_metadata("nope"), "NOT_FOUND", "'nope'")
    expect(lambda: client.is_model_ready("tensors", "4"), "NOT_FOUND", "version 4")
    feeds = tensor_feeds()
    expect(lambda: client.infer("tensors", tensor_inputs(grpcclient, {"x": feeds["x"]})), "INVALID_ARGUMENT", "'s'")
    expect(lambda: client.infer("tensors", tensor_inputs(grpcclient, {**feeds, "x": feeds["x"].ravel()})),
           "INVALID_ARGUMENT", "'x'")
    expect(lambda: client.infer("tensors", good, outputs=[grpcclient.InferRequestedOutput("z")]),
           "INVALID_ARGUMENT", "unknown output(s) ['z']")
    ids = tokens(tiny_model)
    ids["input_ids"] = ids["input_ids"].copy()
    ids["input_ids"][0, 1] = 10**9
    expect(lambda: client.infer("clf", tensor_inputs(grpcclient, ids)), "INVALID_ARGUMENT", "input_ids")
    bad = grpcclient.InferInput("x", [2, 3], "FP128")
    bad._raw_content = feeds["x"].tobytes()
    expect(lambda: client.infer("tensors", [bad]), "INVALID_ARGUMENT", "unknown datatype 'FP128'")
    latin1 = tensor_inputs(grpcclient, {**feeds, "s": np.array([b"caf\xe9", b"ok"], dtype=np.object_)})
    expect(lambda: client.infer("tensors", latin1), "INVALID_ARGUMENT", "'s'", "UTF-8")
    wrong_size = grpcclient.InferInput("x", [2, 3], "FP32")
    wrong_size._raw_content = b"\x00" * 5
    expect(lambda: client.infer("tensors", [wrong_size]), "INVALID_ARGUMENT", "'x'", "shape [2, 3]")


def test_unavailable_with_retry_hint_and_over_the_limit(worker, client):
    feeds = tokens_like(client)
    error = expect(lambda: client.infer("gone", feeds), "UNAVAILABLE", "retry after")
    assert "Triton" in error.message() or "triton" in error.message()
    request = service_pb2.ModelInferRequest(model_name="gone")
    for t in feeds:
        request.inputs.add(name=t.name(), datatype=t.datatype(), shape=t.shape())
        request.raw_input_contents.append(t._get_content())
    with grpc.insecure_channel(worker.grpc) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert int(dict(info.value.trailing_metadata())["retry-after"]) >= 1
    big = grpcclient.InferInput("x", [MAX_BODY // 12 + 10, 3], "FP32")
    big.set_data_from_numpy(np.zeros((MAX_BODY // 12 + 10, 3), dtype=np.float32))
    strings = grpcclient.InferInput("s", [MAX_BODY // 12 + 10], "BYTES")
    strings.set_data_from_numpy(np.array([b""] * (MAX_BODY // 12 + 10), dtype=np.object_))
    expect(lambda: client.infer("tensors", [big, strings]), "RESOURCE_EXHAUSTED", str(MAX_BODY))


def tokens_like(client) -> list:
    return tensor_inputs(grpcclient, {"input_ids": np.array([[101, 7, 102]], dtype=np.int64),
                                      "attention_mask": np.ones((1, 3), dtype=np.int64),
                                      "token_type_ids": np.zeros((1, 3), dtype=np.int64)})


def test_deadline_exceeded(client, tiny_model):
    """A call whose deadline passes before the answer: DEADLINE_EXCEEDED, and the worker goes on."""
    ids = {k: np.repeat(v, 64, axis=0) for k, v in tokens(tiny_model, " ".join([TEXT] * 12)).items()}
    expect(lambda: client.infer("clf", tensor_inputs(grpcclient, ids), client_timeout=0.005), "DEADLINE_EXCEEDED")
    assert client.infer("tensors", tensor_inputs(grpcclient, tensor_feeds())).get_response().model_version == "1"


def test_the_docs_grpc_example_runs_as_written(worker, capsys):
    """docs/serving.md's tritonclient.grpc example, pointed at this worker and its endpoint."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "serving.md").read_text()
    section = text[text.index("## The v2 protocol over gRPC"):]
    (block,) = re.findall(r"^```python\n(.*?)^```$", section[:section.index("\n## ", 5)], re.M | re.S)
    exec(block.replace("localhost:9091", worker.grpc).replace('"sentiment"', '"clf"'), {})
    out = capsys.readouterr().out
    assert "True" in out and "logits" in out and out.rstrip().endswith(" 1")  # model_version 1 printed last


def test_model_calls_answer_with_their_request_id_in_the_initial_metadata(worker):
    """serving/worker/request_ids.py over gRPC: the client's ``x-request-id`` metadata when usable, else a new
    UUID, on answers and on errors alike."""
    with grpc.insecure_channel(worker.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        infer = service_pb2.ModelInferRequest(model_name="tensors")
        for name, value in tensor_feeds().items():
            datatype = "BYTES" if value.dtype == np.object_ else "FP32"
            infer.inputs.add(name=name, datatype=datatype, shape=list(value.shape))
            infer.raw_input_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in value.ravel())
                                            if datatype == "BYTES" else value.astype(np.float32).tobytes())
        _, call = stub.ModelInfer.with_call(infer, metadata=(("x-request-id", "order-17/attempt-2"),))
        assert dict(call.initial_metadata())["x-request-id"] == "order-17/attempt-2"
        _, call = stub.ModelMetadata.with_call(service_pb2.ModelMetadataRequest(name="tensors"),
                                               metadata=(("x-request-id", "two words"),))
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                            dict(call.initial_metadata())["x-request-id"])
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(service_pb2.ModelInferRequest(model_name="nope"), metadata=(("x-request-id", "mine-3"),))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # no inputs
        assert dict(refused.value.initial_metadata())["x-request-id"] == "mine-3"


def test_a_malformed_traceparent_is_invalid_argument_naming_it(worker):
    """docs/tracing.md over gRPC: the ``traceparent`` metadata is checked as the HTTP header is."""
    with grpc.insecure_channel(worker.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="tensors"), metadata=(("traceparent", "00-x-01"),))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "traceparent '00-x-01' is not a W3C trace context" in refused.value.details()
        good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        answer = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="tensors"), metadata=(("traceparent", good),))
        assert answer.name == "tensors"
