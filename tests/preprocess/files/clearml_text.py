"""A preprocess.py as ClearML Serving users write them: no import from this project."""
from typing import Any

import numpy as np
from transformers import AutoTokenizer


class Preprocess:
    def __init__(self):
        self.tokenizer = None

    def load(self, local_file_name: str) -> Any:
        return None

    def preprocess(self, body: dict, state: dict, collect_custom_statistics_fn=None) -> Any:
        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(body["tokenizer_dir"])
        tokens = self.tokenizer(text=body["text"], truncation=True, max_length=32, return_tensors="np")
        if collect_custom_statistics_fn:
            collect_custom_statistics_fn({"words": len(body["text"].split())})
        # a list in the model's input order, plain Python lists, like the ClearML examples
        return [tokens["input_ids"].tolist(), tokens["attention_mask"].tolist(), tokens["token_type_ids"].tolist()]

    def postprocess(self, data: Any, state: dict, collect_custom_statistics_fn=None) -> dict:
        return {"data": np.asarray(data).tolist(), "argmax": int(np.argmax(data))}
