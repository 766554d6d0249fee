"""The demo's classifier: a fitted head, exported faithfully, that gets the demo's examples right."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from transformers import AutoTokenizer

from serving.demo import EXPECTED, TEXTS, V2_TRAIN_SIZE
from serving.testmodels import (
    SENTIMENT_DATA, SENTIMENT_LABELS, build_sentiment_classifier, encode_sentences, head_logits,
    load_sentiment_data, load_sentiment_head, load_torch_model, sentiment_params, split_sentiment_data,
    sentiment_training_subset,
)


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    """Version 1 of the demo (~20 s on 2 CPU cores: encode 360 sentences, fit, export)."""
    return build_sentiment_classifier(tmp_path_factory.mktemp("sentiment-v1"))


@pytest.fixture(scope="module")
def data():
    texts, labels = load_sentiment_data()
    train, held_out = split_sentiment_data(labels)
    return texts, labels, train, held_out


@pytest.fixture(scope="module")
def onnx_logits(v1, data):
    """Exported model, onnxruntime, padded batches of 32 as the worker sends them: held-out texts, then TEXTS."""
    texts, _, _, held_out = data
    batch = [texts[i] for i in held_out] + TEXTS
    tok = AutoTokenizer.from_pretrained(str(v1.tokenizer_dir))
    session = ort.InferenceSession(str(v1.onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    out = []
    for i in range(0, len(batch), 32):
        enc = tok(batch[i:i + 32], padding=True, truncation=True, max_length=128, return_tensors="np")
        out.append(session.run(["logits"], {n: enc[n].astype(np.int64) for n in names})[0])
    return batch, np.concatenate(out)


def test_data_is_balanced_and_split_deterministically(data):
    texts, labels, train, held_out = data
    assert 300 <= len(texts) <= 400 and len(set(texts)) == len(texts)
    assert (labels == 1).sum() == (labels == 0).sum()
    assert not set(TEXTS) & set(texts)  # the demo's examples are not training data
    assert not set(train) & set(held_out) and len(train) + len(held_out) == len(texts)
    assert np.bincount(labels[held_out]).tolist() == [len(held_out) // 2] * 2
    small = sentiment_training_subset(train, V2_TRAIN_SIZE)
    assert np.bincount(labels[small]).tolist() == [V2_TRAIN_SIZE // 2] * 2
    again_train, again_held_out = split_sentiment_data(labels)
    assert np.array_equal(train, again_train) and np.array_equal(held_out, again_held_out)


def test_onnx_equals_encoder_plus_numpy_head(v1, onnx_logits):
    """One ONNX graph == the torch encoder's mean-pooled output through the fitted head in numpy."""
    batch, got = onnx_logits
    weight, bias = load_sentiment_head(v1.onnx_path.parent)
    assert weight.shape == (2, 384) and bias.shape == (2,)
    features = encode_sentences(load_torch_model(v1.onnx_path.parent), batch, v1.tokenizer_dir)
    assert got.dtype == np.float32 and got.shape == (len(batch), 2)
    np.testing.assert_allclose(got, head_logits(features, weight, bias), rtol=0, atol=1e-4)


def test_interface_is_the_other_models(v1):
    session = ort.InferenceSession(str(v1.onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.type == "tensor(int64)" for i in session.get_inputs())
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert v1.labels == SENTIMENT_LABELS == ["NEGATIVE", "POSITIVE"]
    assert v1.signature["outputs"] == [{"name": "logits", "dtype": "FP32", "shape": [-1, 2]}]


def test_held_out_accuracy_and_the_demo_examples(v1, data, onnx_logits):
    _, labels, train, held_out = data
    _, logits = onnx_logits
    predicted = logits.argmax(1)
    accuracy = float((predicted[:len(held_out)] == labels[held_out]).mean())
    assert v1.train_size == len(train) and v1.held_out_size == len(held_out)
    assert accuracy == pytest.approx(v1.held_out_accuracy)  # what the demo prints is what the ONNX model does
    assert accuracy >= 0.85
    assert [SENTIMENT_LABELS[k] for k in predicted[len(held_out):]] == EXPECTED


def test_version_two_sees_fewer_examples_and_is_cached(v1, tmp_path):
    v2 = build_sentiment_classifier(tmp_path / "v2", train_size=V2_TRAIN_SIZE)
    assert v2.train_size == V2_TRAIN_SIZE and v2.held_out_size == v1.held_out_size
    assert v2.held_out_accuracy < v1.held_out_accuracy  # the canary is visibly the weaker model

    mtime = v1.onnx_path.stat().st_mtime_ns
    assert build_sentiment_classifier(v1.onnx_path.parent) == v1 and v1.onnx_path.stat().st_mtime_ns == mtime

    edited = tmp_path / "sentiment.tsv"
    edited.write_text(SENTIMENT_DATA.read_text() + "POSITIVE\tA new sentence changes the data.\n")
    assert sentiment_params(data_path=edited) != sentiment_params()  # the cache key follows the data
