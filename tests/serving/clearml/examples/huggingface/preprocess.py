"""Fixture for the ``triton`` engine with a tokenizer fetched by name from the Hugging Face hub (here:
its local cache, which the test fills) when the instance is made.

``preprocess`` returns a list of three arrays in the order of the ``--input-name`` flags, which is
not the order of the model's own inputs: the worker binds them by the declared names.
"""
import numpy as np
from transformers import AutoTokenizer

TOKENIZER = "serving-tests/tiny-bert-tokenizer"
DECLARED = ("input_ids", "token_type_ids", "attention_mask")


class Preprocess:
    def __init__(self):
        self.tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        encoding = self.tokenizer(text=body["text"], max_length=16, truncation=True, return_tensors="np")
        return [encoding[name].tolist() for name in DECLARED]

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"data": np.asarray(data).tolist()}
