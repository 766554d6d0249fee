"""The embedded Triton as `serving triton` runs it: a real tritonserver process over gRPC.

A FakeControlPlane stands in for the control plane (built elsewhere in the project):
it serves the config stream and the artifacts, nothing else.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from tests.serving.triton.fake_control_plane import FakeControlPlane, running, target, triton_endpoint
from tests.support.procs import wait_until
from tests.support.procs import free_port, serving_process, wait_http


def batch_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 5000, (batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[-1, seq // 2:] = 0  # one padded row, so the mask matters
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def grpc_logits(client: grpcclient.InferenceServerClient, model: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    inputs = []
    for name, array in feeds.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput("logits")])
    return result.as_numpy("logits")


def direct_logits(onnx_path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(onnx_path)).run(["logits"], feeds)[0]


@pytest.mark.timeout(120)
def test_embedded_triton_serves_and_hot_adds_models(tmp_path, tiny_model, tiny_model_b):
    fake = FakeControlPlane()
    sha_a = fake.add_artifact(tiny_model.onnx_path)
    sha_b = fake.add_artifact(tiny_model_b.onnx_path)
    fake.publish({"clf": triton_endpoint("clf", [target("clf", 1, sha_a, tiny_model.signature)])})
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    with running(fake) as cp_url:
        env = {
            "SERVING_HOME": str(tmp_path / "home"), "SERVING_CONTROL_PLANE_URL": cp_url,
            "SERVING_TRITON_HTTP_PORT": str(http_port), "SERVING_TRITON_GRPC_PORT": str(grpc_port),
            "SERVING_TRITON_METRICS_PORT": str(metrics_port),
        }
        with serving_process(["triton"], env, tmp_path / "triton.log") as proc:
            base = f"http://127.0.0.1:{http_port}"
            wait_http(base + "/v2/models/clf_v1/ready", timeout=60, proc=proc)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

            # Behind Triton's dynamic batcher, configured from the endpoint's `batching`.
            config = client.get_model_config("clf_v1", as_json=True)["config"]
            assert config["max_batch_size"] == 8
            assert config["dynamic_batching"]["preferred_batch_size"] == [4]
            assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000

            feeds = batch_inputs(3, 12, seed=0)
            got = grpc_logits(client, "clf_v1", feeds)
            assert got.shape == (3, 2) and got.dtype == np.float32
            np.testing.assert_allclose(got, direct_logits(tiny_model.onnx_path, feeds), atol=1e-4)

            # Version 2 arrives as a new snapshot: loaded into the same server process.
            fake.publish({"clf": triton_endpoint("clf", [
                target("clf", 1, sha_a, tiny_model.signature, 50.0),
                target("clf", 2, sha_b, tiny_model_b.signature, 50.0)])})
            wait_http(base + "/v2/models/clf_v2/ready", timeout=30, proc=proc)
            feeds = batch_inputs(2, 7, seed=1)
            want_b = direct_logits(tiny_model_b.onnx_path, feeds)
            np.testing.assert_allclose(grpc_logits(client, "clf_v2", feeds), want_b, atol=1e-4)
            assert not np.allclose(want_b, direct_logits(tiny_model.onnx_path, feeds), atol=1e-4)
            assert client.is_model_ready("clf_v1")

            # Version 1 leaves the snapshot: unloaded, the server and version 2 keep going.
            fake.publish({"clf": triton_endpoint("clf", [target("clf", 2, sha_b, tiny_model_b.signature)])})
            wait_until(lambda: not client.is_model_ready("clf_v1"), 30, "clf_v1 unloaded")
            np.testing.assert_allclose(grpc_logits(client, "clf_v2", feeds), want_b, atol=1e-4)
            assert proc.poll() is None

            # Batching off (max_batch_size 0): Triton's model takes whole shapes, batch dimension included,
            # so the [1, seq] tensors a worker sends still fit.
            fake.publish({"clf": triton_endpoint("clf", [target("clf", 2, sha_b, tiny_model_b.signature)]),
                          "flat": triton_endpoint("flat", [target("flat", 1, sha_a, tiny_model.signature)],
                                                  max_batch_size=0)})
            wait_http(base + "/v2/models/flat_v1/ready", timeout=30, proc=proc)
            assert client.get_model_config("flat_v1", as_json=True)["config"].get("max_batch_size", 0) == 0
            feeds = batch_inputs(1, 9, seed=2)
            np.testing.assert_allclose(grpc_logits(client, "flat_v1", feeds),
                                       direct_logits(tiny_model.onnx_path, feeds), atol=1e-4)
            client.close()
        assert proc.returncode == 0, (tmp_path / "triton.log").read_text()[-3000:]
    log = (tmp_path / "triton.log").read_text()
    assert "Traceback" not in log, log[-3000:]
