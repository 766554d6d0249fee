"""Client keys over gRPC (``authorization: Bearer sk_...`` metadata), as HTTP checks them: a real worker
with SERVING_CLIENT_KEYS_REQUIRED=true and keys in its config snapshot, NVIDIA's client."""
from __future__ import annotations

import secrets

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from registry.artifacts import ArtifactStore
from serving.credentials import secret_sha256
from tests.serving.worker.grpc_worker import run_worker, tensor_feeds, tensor_inputs, tensor_model, tensor_spec
from tests.serving.worker.support import snapshot

OPEN, SCOPED, SLOW = (f"sk_{secrets.token_hex(32)}" for _ in range(3))


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    paths = tmp_path_factory.mktemp("grpc-keys")
    store = ArtifactStore(paths / "home" / "artifacts")
    model = tensor_model(paths / "tensors.onnx")
    config = snapshot(tensor_spec("tensors", model, store), tensor_spec("private", model, store))
    config["client_keys"] = {
        "open": {"sha256": secret_sha256(OPEN), "endpoints": None, "rate": None, "burst": None},
        "scoped": {"sha256": secret_sha256(SCOPED), "endpoints": ["tensors"], "rate": None, "burst": None},
        "slow": {"sha256": secret_sha256(SLOW), "endpoints": None, "rate": 0.01, "burst": 1}}
    with run_worker(paths / "home", config, SERVING_CLIENT_KEYS_REQUIRED="true") as w:
        yield w


def inputs() -> list:
    return tensor_inputs(grpcclient, tensor_feeds())


def call(client, endpoint: str, key: str | None):
    return client.infer(endpoint, inputs(), headers={"authorization": f"Bearer {key}"} if key else None)


def refused(client, endpoint: str, key: str | None, code: str, words: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client, endpoint, key)
    assert info.value.status() == f"StatusCode.{code}" and words in info.value.message(), info.value.message()


def test_keys_are_checked_with_their_grpc_codes(worker):
    client = grpcclient.InferenceServerClient(worker.grpc)
    try:
        assert client.is_server_live() and client.is_server_ready()  # probes need no key
        np.testing.assert_array_equal(call(client, "private", OPEN).as_numpy("y"), tensor_feeds()["x"] * 2)
        assert call(client, "tensors", SCOPED).get_response().model_version == "1"
        refused(client, "tensors", None, "UNAUTHENTICATED", "client key is required")
        refused(client, "tensors", "sk_" + "0" * 64, "UNAUTHENTICATED", "invalid or revoked")
        refused(client, "private", SCOPED, "PERMISSION_DENIED", "may not call endpoint 'private'")
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("private", headers={"authorization": f"Bearer {SCOPED}"})
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert client.get_model_metadata("tensors", headers={"authorization": f"Bearer {SCOPED}"}).name == "tensors"
        call(client, "tensors", SLOW)  # its burst of 1
        refused(client, "tensors", SLOW, "RESOURCE_EXHAUSTED", "over its rate")
    finally:
        client.close()


def test_rate_refusal_carries_the_retry_hint(worker):
    request = service_pb2.ModelInferRequest(model_name="tensors")
    for t in inputs():
        request.inputs.add(name=t.name(), datatype=t.datatype(), shape=t.shape())
        request.raw_input_contents.append(t._get_content())
    with grpc.insecure_channel(worker.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        metadata = (("authorization", f"Bearer {SLOW}"),)
        for _ in range(2):  # the first may still find its burst; the second cannot
            try:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert int(dict(exc.trailing_metadata())["retry-after"]) >= 1
                return
    raise AssertionError("a key with rate 0.01/s and burst 1 answered twice in a row")
