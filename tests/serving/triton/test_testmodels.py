"""The offline test models: ONNX export must compute what the torch model computes."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from serving.testmodels import (
    INPUT_NAMES, TOKENIZER_FILES, build_bert_classifier, load_torch_model, make_torch_model, minilm_dir,
)


@pytest.mark.parametrize("batch,seq", [(1, 3), (4, 17)])
def test_onnx_logits_equal_torch(tiny_model, batch, seq):
    rng = np.random.default_rng(seq)
    ids = rng.integers(1000, 5000, (batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[-1, (seq + 1) // 2:] = 0  # padding must be honoured by the exported graph
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    onnx_logits = ort.InferenceSession(str(tiny_model.onnx_path)).run(["logits"], feeds)[0]
    with torch.no_grad():
        torch_logits = load_torch_model(tiny_model.onnx_path.parent)(
            **{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()

    assert onnx_logits.dtype == np.float32 and onnx_logits.shape == (batch, 2)
    np.testing.assert_allclose(onnx_logits, torch_logits, atol=1e-5)


def test_bundle_layout_and_signature(tiny_model):
    session = ort.InferenceSession(str(tiny_model.onnx_path))
    assert [i.name for i in session.get_inputs()] == list(INPUT_NAMES)
    assert all(i.type == "tensor(int64)" and len(i.shape) == 2 for i in session.get_inputs())
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert all(isinstance(d, str) for d in session.get_inputs()[0].shape)  # dynamic batch and sequence
    assert sorted(p.name for p in tiny_model.tokenizer_dir.iterdir()) == sorted(TOKENIZER_FILES)
    assert tiny_model.labels == ["NEGATIVE", "POSITIVE"]
    assert json.loads((tiny_model.onnx_path.parent / "labels.json").read_text()) == tiny_model.labels
    assert tiny_model.signature["outputs"] == [{"name": "logits", "dtype": "FP32", "shape": [-1, 2]}]
    assert [i["name"] for i in tiny_model.signature["inputs"]] == list(INPUT_NAMES)


def test_rebuild_uses_cache_and_other_params_reexport(tiny_model, tmp_path):
    mtime = tiny_model.onnx_path.stat().st_mtime_ns
    again = build_bert_classifier(tiny_model.onnx_path.parent)
    assert again == tiny_model and tiny_model.onnx_path.stat().st_mtime_ns == mtime

    three = build_bert_classifier(tmp_path, num_layers=1, hidden_size=32, intermediate_size=64, num_labels=3)
    assert three.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert three.signature["outputs"][0]["shape"] == [-1, 3]


def test_minilm_encoder_weights_come_from_the_package():
    """Export path is shared with the tiny model; check the weights, not 90 MB of ONNX again."""
    from safetensors.numpy import load_file

    model = make_torch_model({"kind": "minilm", "num_labels": 2, "seed": 0})
    packaged = load_file(str(minilm_dir() / "model.safetensors"))
    name = "encoder.layer.5.output.dense.weight"
    state = model.bert.state_dict()
    np.testing.assert_array_equal(state[name].numpy(), packaged[name])
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    head = make_torch_model({"kind": "minilm", "num_labels": 2, "seed": 0}).classifier.weight
    torch.testing.assert_close(model.classifier.weight, head)  # seeded head: reproducible
