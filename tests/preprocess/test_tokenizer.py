"""The built-in tokenizer equals transformers' fast tokenizer, pads to the longest, truncates."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from transformers import AutoTokenizer

from preprocess.base import PreprocessError
from preprocess.tokenizer import TokenizerProcessor, read_texts


def encode(processor, texts):
    state: dict = {}
    return asyncio.run(processor.preprocess({"texts": texts}, state, lambda _: None))


def test_same_tensors_as_transformers_with_dynamic_padding(tiny_model):
    texts = ["hi", "Un café à Paris, s'il vous plaît!", "word " * 300]
    ours = encode(TokenizerProcessor(tiny_model.tokenizer_dir, max_length=64), texts)
    ref = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))(
        texts, truncation=True, max_length=64, padding=True, return_tensors="np")
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours[name], ref[name])
    assert ours["input_ids"].shape == (3, 64)
    short = encode(TokenizerProcessor(tiny_model.tokenizer_dir, max_length=64), ["hi", "hello there"])
    assert short["input_ids"].shape[1] == 4  # [CLS] hello there [SEP]: padded to the longest, not to 64


def test_padding_to_a_multiple_makes_shared_shapes(tiny_model):
    processor = TokenizerProcessor(tiny_model.tokenizer_dir, max_length=64, pad_to_multiple_of=16)
    assert encode(processor, ["hi"])["input_ids"].shape == (1, 16)
    assert encode(processor, ["word " * 20])["input_ids"].shape == (1, 32)
    assert encode(processor, ["word " * 300])["input_ids"].shape == (1, 64)  # never beyond max_length
    with pytest.raises(ValueError, match="not a multiple"):
        TokenizerProcessor(tiny_model.tokenizer_dir, max_length=100, pad_to_multiple_of=16)


def test_postprocess_labels_scores_and_statistics(tiny_model):
    processor = TokenizerProcessor(tiny_model.tokenizer_dir, labels=["NEG", "POS"])
    seen: dict = {}
    state = {"single": True}
    out = asyncio.run(processor.postprocess({"logits": np.array([[0.0, 2.0]], np.float32)}, state, seen.update))
    assert out["label"] == "POS" and out["score"] == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert seen == {"label": "POS", "score": out["score"]}


@pytest.mark.parametrize("body, words", [
    ({}, 'missing field "text"'), ({"text": None}, "must be a string"), ({"texts": "abc"}, "non-empty list"),
    ({"texts": ["x"] * 1000}, "at most"), ("text", "JSON object"),
])
def test_bad_bodies(body, words):
    with pytest.raises(PreprocessError, match=words):
        read_texts(body)
