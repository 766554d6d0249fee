"""Which models Triton batches and how their tensors are declared (serving/triton/shapes.py), for
both configs we write: the embedded Triton's Python backend and NVIDIA's onnxruntime backend.
The end-to-end proof against a real tritonserver is tests/serving/test_strings_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from serving.triton.python_backend import model_config as python_config
from serving.triton.repository import TritonTarget, config_pbtxt, validate_config_pbtxt
from serving.triton.shapes import batch_size, batchable, from_api, padded, to_api

ROWS = {"inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, 3]}, {"name": "s", "dtype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "y", "dtype": "FP32", "shape": [-1, 3]}, {"name": "t", "dtype": "BYTES", "shape": [-1]}]}
COUNT = {"inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, 3]}],
         "outputs": [{"name": "n", "dtype": "INT64", "shape": []}]}
FIXED = {"inputs": [{"name": "x", "dtype": "FP32", "shape": [1, 3]}],
         "outputs": [{"name": "y", "dtype": "FP32", "shape": [1, 3]}]}


@pytest.mark.parametrize("signature, ok", [(ROWS, True), (COUNT, False), (FIXED, False), (None, True)])
def test_only_models_whose_every_tensor_starts_with_a_free_batch_dimension_are_batched(signature, ok):
    assert batchable(signature) is ok
    assert batch_size({"max_batch_size": 16}, signature) == (16 if ok else 0)
    assert batch_size({"max_batch_size": 0}, signature) == 0


@pytest.mark.parametrize("build", ["onnxruntime", "python"])
def test_batched_rank_one_tensors_are_declared_dims_1_reshaped_to_nothing(build):
    target = TritonTarget("rows_v1", "sha", ROWS, {"max_batch_size": 8})
    cfg = (validate_config_pbtxt(config_pbtxt(target)) if build == "onnxruntime"
           else python_config(target, ROWS, threads=1))
    validate_config_pbtxt(text_format.MessageToString(cfg))
    assert cfg.max_batch_size == 8
    tensors = {t.name: t for t in [*cfg.input, *cfg.output]}
    assert list(tensors["x"].dims) == [3] and not tensors["x"].HasField("reshape")
    for name in ("s", "t"):
        assert list(tensors[name].dims) == [1] and tensors[name].HasField("reshape")
        assert list(tensors[name].reshape.shape) == []


@pytest.mark.parametrize("build", ["onnxruntime", "python"])
def test_a_model_with_a_scalar_output_is_served_unbatched_whatever_the_endpoint_asks(build):
    target = TritonTarget("count_v1", "sha", COUNT, {"max_batch_size": 32})
    cfg = (validate_config_pbtxt(config_pbtxt(target)) if build == "onnxruntime"
           else python_config(target, COUNT, threads=1))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    n = next(t for t in cfg.output if t.name == "n")
    assert list(n.dims) == [1] and not n.HasField("reshape")  # Triton refuses an empty reshape unbatched
    assert list(next(t for t in cfg.input if t.name == "x").dims) == [-1, 3]


def test_the_worker_adds_and_drops_the_trailing_one_for_exactly_those_tensors():
    ranks = padded([*ROWS["inputs"], *ROWS["outputs"]], batched=True)
    assert ranks == {"s": 1, "t": 1}
    sent = to_api({"x": np.zeros((2, 3), np.float32), "s": np.array([b"a", b"b"], np.object_)}, ranks)
    assert sent["x"].shape == (2, 3) and sent["s"].shape == (2, 1)
    back = from_api({"y": np.zeros((2, 3)), "t": np.array([[b"a"], [b"b"]], np.object_)}, ranks)
    assert back["y"].shape == (2, 3) and back["t"].tolist() == [b"a", b"b"]
    # one row, already in the model's shape (the Python backend's answer): left alone
    assert from_api({"t": np.array([b"a"], np.object_)}, ranks)["t"].shape == (1,)
    unbatched = padded(COUNT["outputs"], batched=False)
    assert unbatched == {"n": 0}
    assert from_api({"n": np.array([9])}, unbatched)["n"].shape == ()


@pytest.mark.parametrize("endpoint,fixed,served", [(32, 8, 8), (4, 8, 4), (0, 8, 8), (32, 0, 0), (0, 0, 0)])
def test_a_model_with_its_own_config_pbtxt_keeps_its_max_batch_size(endpoint, fixed, served):
    """Its dims mean what its max_batch_size says: batched or not is the model's; the endpoint's
    --max-batch-size can only make the worker's calls smaller."""
    signature = {"inputs": [{"name": "TEXT", "dtype": "BYTES", "shape": [-1] if fixed else [3]}], "outputs": [],
                 "max_batch_size": fixed}
    assert batch_size({"max_batch_size": endpoint}, signature) == served
