"""String (BYTES) tensors through the Triton engine, real processes on real sockets: control plane,
`serving triton` (the embedded tritonserver, Python backend) and `serving worker`.

A model whose output echoes its string input is the sharpest probe: the answer must be the very
text that was sent (once it was ``"b'caf\\xc3\\xa9'"`` with status 200), equal to onnxruntime run
directly. Two models, because Triton declares them differently (serving/triton/shapes.py):

* ``tensors`` has a scalar output, so it is served unbatched (batching would split a count of all
  rows across requests), its scalar travelling as ``[1]``;
* ``rows`` is all per-row, so it is batched, and its ``[batch]`` string tensors travel as
  ``[batch, 1]`` (``dims: [1]``, ``reshape: []``): the client still sees ``[batch]``.

A string that is not UTF-8 is the client's fault, 400 naming the input, never a 5xx, and the
endpoint keeps answering after it.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tritonclient.utils import serialize_byte_tensor

from tests.serving.stack import make_stack
from tests.serving.worker.grpc_worker import tensor_model

TEXTS = ["café", "naïve 東京", "ok"]


def rows_model(path):
    """``y = x + x``, ``t = s``: every tensor starts with the batch dimension."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Identity", ["s"], ["t"])], "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("t", TensorProto.STRING, ["batch"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("strings-stack")
    models = {"tensors": tensor_model(home / "tensors.onnx"), "rows": rows_model(home / "rows.onnx")}
    s = make_stack(home / "home", workers=1)
    try:
        s.start_components(statistics=False, triton=True)
        for name, path in models.items():
            s.cli("model", "upload", "--name", name, "--path", str(path))
            s.cli("model", "add", "--endpoint", name, "--model", name, "--engine", "triton", "--wait")
        s.models = models
        yield s
    finally:
        s.stop_all()


def infer_json(url: str, endpoint: str, x: np.ndarray, texts: list[str]) -> httpx.Response:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()},
                       {"name": "s", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    return httpx.post(f"{url}/v2/models/{endpoint}/infer", json=body, timeout=60)


def infer_binary(url: str, endpoint: str, x: np.ndarray, strings: list[bytes]) -> httpx.Response:
    """The v2 binary-data extension: the only way to send bytes that are not text in JSON."""
    xs = x.tobytes()
    ss = serialize_byte_tensor(np.array(strings, dtype=np.object_)).item()
    header = json.dumps({"inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": len(xs)}},
        {"name": "s", "shape": [len(strings)], "datatype": "BYTES", "parameters": {"binary_data_size": len(ss)}},
    ]}).encode()
    return httpx.post(f"{url}/v2/models/{endpoint}/infer", content=header + xs + ss, timeout=30,
                      headers={"Inference-Header-Content-Length": str(len(header)),
                               "content-type": "application/octet-stream"})


def direct(path, x: np.ndarray, texts: list[str]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {"x": x, "s": np.array(texts, dtype=np.object_)})))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("endpoint", ["tensors", "rows"])
def test_triton_engine_answers_strings_as_the_text_sent(stack, endpoint):
    x = np.arange(9, dtype=np.float32).reshape(3, 3) / 7
    r = infer_json(stack.worker_url(), endpoint, x, TEXTS)
    assert r.status_code == 200, r.text
    got = {o["name"]: o for o in r.json()["outputs"]}
    want = direct(stack.models[endpoint], x, TEXTS)
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name]["shape"] == list(value.shape), name  # the model's own shapes, never Triton's [.., 1]
    assert got["t"]["data"] == [str(t) for t in want["t"]] == TEXTS
    np.testing.assert_allclose(np.array(got["y"]["data"]).reshape(3, 3), want["y"], atol=1e-6)
    if "n" in want:
        assert got["n"]["data"] == [int(want["n"])] == [9]


@pytest.mark.timeout(300)
def test_batched_string_rows_answer_each_client_its_own_text(stack):
    """Concurrent one-row requests, merged by the worker's batcher and Triton's: each answer is its
    own request's text and numbers, never a neighbour's."""
    def one(i: int) -> tuple[int, httpx.Response]:
        return i, infer_json(stack.worker_url(), "rows", np.full((1, 3), i, np.float32), [f"row {i} ü"])

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(48)))
    for i, r in answers:
        assert r.status_code == 200, r.text
        got = {o["name"]: o for o in r.json()["outputs"]}
        assert got["t"]["data"] == [f"row {i} ü"] and got["t"]["shape"] == [1]
        assert got["y"]["data"] == [2.0 * i] * 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("endpoint", ["tensors", "rows"])
def test_triton_engine_refuses_a_string_that_is_not_utf8_and_keeps_answering(stack, endpoint):
    x = np.ones((1, 3), np.float32)
    r = infer_binary(stack.worker_url(), endpoint, x, [b"\xff\xfe"])
    assert r.status_code == 400, r.text
    assert "'s'" in r.text and "UTF-8" in r.text
    r = infer_binary(stack.worker_url(), endpoint, x, ["später".encode()])
    assert r.status_code == 200, r.text
