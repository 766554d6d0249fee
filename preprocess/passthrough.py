"""No preprocessing: the body names the model's tensors, the answer returns the model's outputs.

``{"inputs": {"input_ids": [[...]], ...}}`` (or the tensors at the top level) in,
``{"outputs": {"logits": [[...]]}}`` out: the shape a user of a plain ``/serve``
endpoint without a tokenizer or ``preprocess.py`` expects.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from preprocess.base import Collect, PreprocessError


class PassthroughProcessor:
    outputs_form = "dict"
    has_process = False

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> Any:
        if not isinstance(body, dict):
            raise PreprocessError('the body must be a JSON object of tensors: {"inputs": {"name": [...]}}')
        tensors = body.get("inputs", body)
        if not isinstance(tensors, dict) or not tensors:
            raise PreprocessError('"inputs" must be an object mapping input names to nested lists')
        return tensors

    async def process(self, data: Any, state: dict, collect: Collect) -> Any:
        raise PreprocessError("an endpoint without preprocessing needs a model engine (triton or onnxruntime)")

    async def postprocess(self, data: dict[str, np.ndarray], state: dict, collect: Collect) -> Any:
        return {"outputs": {name: np.asarray(v).tolist() for name, v in data.items()}}
