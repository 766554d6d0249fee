"""The embedded Triton's model repository entry: a schema-valid config.pbtxt (backend python) and a
model.py whose batch answers equal onnxruntime run directly on the concatenated inputs.

model.py is exercised as written into the repository, with a small stand-in for Triton's
``triton_python_backend_utils`` (the real backend runs it in test_embedded.py / test_reconcile.py)."""
from __future__ import annotations

import importlib.util
import json
import types

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.triton.python_backend import config_pbtxt, instance_layout, model_config, write_entry
from serving.triton.repository import MARKER, TritonTarget, validate_config_pbtxt

BATCHING = {"max_batch_size": 16, "max_queue_delay_us": 2000, "preferred_batch_sizes": [4, 8, 64], "instances": 2}


def test_config_pbtxt_is_triton_s_schema_with_the_python_backend(tiny_model):
    text = config_pbtxt(TritonTarget("clf_v1", "sha", tiny_model.signature, BATCHING), tiny_model.signature, 3)
    cfg = validate_config_pbtxt(text)
    assert (cfg.name, cfg.backend, cfg.platform) == ("clf_v1", "python", "")
    assert cfg.max_batch_size == 16
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(2, mc.ModelInstanceGroup.KIND_CPU)]
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
        (n, mc.TYPE_INT64, [-1]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("logits", mc.TYPE_FP32, [2])]
    assert cfg.parameters["ort_threads"].string_value == "3"


def test_fixed_shapes_without_batching_keep_the_whole_shape():
    sig = {"inputs": [{"name": "INPUT__0", "dtype": "FP32", "shape": [1, 28, 28]}],
           "outputs": [{"name": "OUTPUT__0", "dtype": "FP32", "shape": [-1, 10]}]}
    cfg = validate_config_pbtxt(config_pbtxt(TritonTarget("mnist_v1", "sha", sig, {"max_batch_size": 0}), sig, 1))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert list(cfg.input[0].dims) == [1, 28, 28] and list(cfg.output[0].dims) == [-1, 10]


def test_instance_layout():
    assert instance_layout(1, cores=2) == (2, 1)              # CPU: a single-thread instance per core
    assert instance_layout(4, cores=2) == (4, 1)              # never fewer than the endpoint asks
    assert instance_layout(1, threads=2, cores=2) == (1, 2)   # SERVING_TRITON_ORT_THREADS
    assert instance_layout(1, threads=2, cores=8) == (4, 2)
    assert instance_layout(1, cores=16) == (4, 4)             # bounded: each instance holds the model
    assert instance_layout(1, cores=8, gpu=True) == (1, 8)    # GPU: the endpoint's count


def test_write_entry_lays_out_the_model_and_reports_changes(tmp_path, tiny_model):
    t = TritonTarget("clf_v1", "sha-a", tiny_model.signature, BATCHING)
    assert write_entry(tmp_path, t, tiny_model.onnx_path, tiny_model.signature, 2)
    entry = tmp_path / "clf_v1"
    assert {p.relative_to(entry).as_posix() for p in entry.rglob("*")} >= {
        "config.pbtxt", MARKER, "1", "1/model.py", "1/model.onnx"}
    assert not write_entry(tmp_path, t, tiny_model.onnx_path, tiny_model.signature, 2)  # unchanged
    assert write_entry(tmp_path, TritonTarget("clf_v1", "sha-b", tiny_model.signature, BATCHING),
                       tiny_model.onnx_path, tiny_model.signature, 2)


class FakeTensor:
    def __init__(self, name, array):
        self.name, self.array = name, np.asarray(array)

    def as_numpy(self):
        return self.array


class FakeResponse:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name: t.as_numpy() for t in output_tensors}
        self.error = error


class FakeError(RuntimeError):
    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message, code="INTERNAL"):
        super().__init__(message)
        self.code = code


def fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = FakeTensor
    pb.InferenceResponse = FakeResponse
    pb.TritonError = FakeError
    pb.get_input_tensor_by_name = lambda request, name: request.get(name)
    return pb


def load_written_model(tmp_path, tiny_model, batching):
    target = TritonTarget("clf_v1", "sha", tiny_model.signature, batching)
    write_entry(tmp_path, target, tiny_model.onnx_path, tiny_model.signature, 1)
    spec = importlib.util.spec_from_file_location("written_model", tmp_path / "clf_v1" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.PB_UTILS = fake_pb_utils()
    config = json_format.MessageToDict(model_config(target, tiny_model.signature, 1), preserving_proto_field_name=True)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(tmp_path / "clf_v1"),
                      "model_version": "1"})
    return model


def request(rng, rows: int, seq: int, padded: bool = True) -> dict[str, FakeTensor]:
    ids = rng.integers(1000, 5000, (rows, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    if padded:
        mask[-1, seq // 2:] = 0
    return {"input_ids": FakeTensor("input_ids", ids), "attention_mask": FakeTensor("attention_mask", mask),
            "token_type_ids": FakeTensor("token_type_ids", np.zeros_like(ids))}


def direct(tiny_model, requests):
    feeds = {n: np.concatenate([r[n].array for r in requests]) for n in requests[0]}
    return ort.InferenceSession(str(tiny_model.onnx_path)).run(["logits"], feeds)[0]


def test_model_py_answers_a_batch_as_onnxruntime_on_the_concatenated_inputs(tmp_path, tiny_model):
    model = load_written_model(tmp_path, tiny_model, BATCHING)
    rng = np.random.default_rng(0)
    requests = [request(rng, rows, 11, padded=False) for rows in (1, 3, 2, 1)]
    calls = []
    run = model.session.run
    model.session.run = lambda *a: calls.append(a) or run(*a)
    responses = model.execute(requests)
    assert len(calls) == 1, "one session.run for the whole batch"
    got = np.concatenate([r.outputs["logits"] for r in responses])
    assert [r.outputs["logits"].shape[0] for r in responses] == [1, 3, 2, 1]
    np.testing.assert_allclose(got, direct(tiny_model, requests), atol=1e-5)


def test_model_py_takes_the_padding_out_of_a_batch(tmp_path, tiny_model):
    """Rows padded behind the mask (the worker's batcher pads to the longest) run in length groups,
    each cut to its longest row: the logits are those of the padded batch."""
    model = load_written_model(tmp_path, tiny_model, BATCHING)
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 5000, (6, 40), dtype=np.int64)
    lengths = np.array([40, 5, 6, 38, 12, 5])
    mask = (np.arange(40)[None, :] < lengths[:, None]).astype(np.int64)
    req = {"input_ids": FakeTensor("input_ids", ids * mask), "attention_mask": FakeTensor("attention_mask", mask),
           "token_type_ids": FakeTensor("token_type_ids", np.zeros_like(ids))}
    widths = []
    run = model.session.run
    model.session.run = lambda names, feeds: widths.append(feeds["input_ids"].shape) or run(names, feeds)
    (resp,) = model.execute([req])
    assert sorted(widths) == [(1, 12), (2, 40), (3, 6)]  # 5,5,6 | 12 | 38,40
    np.testing.assert_allclose(resp.outputs["logits"], direct(tiny_model, [req]), atol=1e-4)


def test_length_groups_bound_the_padding():
    from serving.triton.backend_model import length_groups

    lengths = np.array([100, 10, 11, 12, 90, 50])
    groups = length_groups(lengths)
    assert sorted(sorted(g.tolist()) for g in groups) == [[0, 4], [1, 2, 3], [5]]
    for g in groups:
        assert len(g) * lengths[g].max() <= 1.25 * lengths[g].sum()


def test_model_py_runs_other_shapes_apart_and_fails_only_the_broken_request(tmp_path, tiny_model):
    model = load_written_model(tmp_path, tiny_model, BATCHING)
    rng = np.random.default_rng(1)
    short, long_, other = request(rng, 2, 7), request(rng, 1, 13), request(rng, 1, 7)
    broken = request(rng, 1, 9)
    broken["input_ids"] = FakeTensor("input_ids", broken["input_ids"].array.astype(np.int32))  # onnxruntime refuses
    responses = model.execute([short, long_, broken, other])
    assert responses[2].error is not None and not responses[2].outputs
    np.testing.assert_allclose(np.concatenate([responses[0].outputs["logits"], responses[3].outputs["logits"]]),
                               direct(tiny_model, [short, other]), atol=1e-5)
    np.testing.assert_allclose(responses[1].outputs["logits"], direct(tiny_model, [long_]), atol=1e-5)


@pytest.mark.parametrize("batching", [{"max_batch_size": 0}])
def test_model_py_without_batching_runs_each_request_whole(tmp_path, tiny_model, batching):
    model = load_written_model(tmp_path, tiny_model, batching)
    rng = np.random.default_rng(2)
    requests = [request(rng, 1, 5), request(rng, 1, 5)]
    responses = model.execute(requests)
    for req, resp in zip(requests, responses):
        np.testing.assert_allclose(resp.outputs["logits"], direct(tiny_model, [req]), atol=1e-5)


def test_model_py_gives_string_tensors_to_onnxruntime_as_text(tmp_path):
    """Triton's ``as_numpy`` hands a BYTES tensor over as bytes objects; onnxruntime must get the text
    (it took str() of the bytes: "b'caf\\xc3\\xa9'" came back with status 200). A request that is not
    UTF-8 fails alone."""
    from serving.triton.backend_model import run_batch
    from tests.serving.worker.grpc_worker import tensor_model

    path = tensor_model(tmp_path / "strings.onnx")
    session = ort.InferenceSession(str(path))
    x = np.ones((2, 3), np.float32)
    good = {"x": x, "s": np.array(["café".encode(), b"ok"], dtype=np.object_)}
    bad = {"x": x, "s": np.array([b"\xff", b"ok"], dtype=np.object_)}
    outputs = [o.name for o in session.get_outputs()]
    answered, refused = run_batch(session, ["x", "s"], outputs, [good, bad], batched=True)
    expected = dict(zip(outputs, session.run(outputs, {"x": x, "s": np.array(["café", "ok"], dtype=np.object_)})))
    assert answered["t"].tolist() == ["café", "ok"] == expected["t"].tolist()
    np.testing.assert_allclose(answered["y"], expected["y"])
    assert isinstance(refused, ValueError) and "'s'" in str(refused) and "UTF-8" in str(refused)


def test_model_py_answers_a_string_that_is_not_utf8_as_the_input_s_fault(tmp_path):
    """Triton's INVALID_ARG, which the worker answers 400 (engines/triton_channels.py classify); the rest of
    the batch is answered."""
    from tests.serving.worker.grpc_worker import tensor_model

    import serving.triton.backend_model as backend_model

    (tmp_path / "m" / "1").mkdir(parents=True)
    tensor_model(tmp_path / "m" / "1" / "model.onnx")
    spec = importlib.util.spec_from_file_location("strings_model", backend_model.__file__)  # a copy, as model.py
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.PB_UTILS = fake_pb_utils()
    model = module.TritonPythonModel()
    config = {"max_batch_size": 8, "input": [{"name": "x"}, {"name": "s"}], "output": []}
    model.initialize({"model_config": json.dumps(config), "model_repository": str(tmp_path / "m"),
                      "model_version": "1"})
    x = np.ones((1, 3), np.float32)
    good = {"x": FakeTensor("x", x), "s": FakeTensor("s", np.array([b"ok"], dtype=np.object_))}
    bad = {"x": FakeTensor("x", x), "s": FakeTensor("s", np.array([b"\xff"], dtype=np.object_))}
    answered, refused = model.execute([good, bad])
    assert answered.error is None and answered.outputs["t"].tolist() == ["ok"]
    assert refused.error.code == "INVALID_ARG" and "UTF-8" in str(refused.error)
