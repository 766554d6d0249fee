"""What an answer predicted, as feedback is compared with it: ``{"label": ...}`` or ``{"value": ...}``.

A logged request's statistics event carries it (serving/worker/prediction_capture.py), and the
statistics service joins a later true label or value to it (serving/statistics/ground_truth.py). Read
from the answer as the client got it:

- a JSON object with ``label`` (the built-in tokenizer's answer, most classifiers' postprocess): that
  label; with ``prediction`` or ``value``: a text or an integer is a label, a fractional number a value;
  with ``predictions``, a list of one: what that one predicted;
- v2 output tensors, one of them: a row of scores ``[1, C]`` (C > 1) predicts the index of the largest;
  a single number a value (an integer tensor: a label);
- a bare text is a label, a bare number as above; a list of one, what its item predicted.

Anything else (several predictions in one request, an LLM's text) predicts nothing feedback can score.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def predicted(answer: Any) -> dict[str, Any] | None:
    if isinstance(answer, dict) and answer and all(isinstance(v, np.ndarray) for v in answer.values()):
        return _tensors(answer)
    if isinstance(answer, dict):
        if "label" in answer:
            return _scalar(answer["label"], label=True)
        for key in ("prediction", "value"):
            if key in answer:
                return _scalar(answer[key])
        items = answer.get("predictions")
        return predicted(items[0]) if isinstance(items, list) and len(items) == 1 else None
    if isinstance(answer, list):
        return predicted(answer[0]) if len(answer) == 1 else None
    return _scalar(answer)


def _scalar(value: Any, label: bool = False) -> dict[str, Any] | None:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, list) and len(value) == 1:
        return _scalar(value[0], label)
    if isinstance(value, bool):
        return {"label": str(value).lower()}
    if isinstance(value, str) or (label and isinstance(value, (int, float))):
        return {"label": value if isinstance(value, str) else int(value) if float(value).is_integer() else value}
    if isinstance(value, int):
        return {"label": value}
    if isinstance(value, float):
        return {"value": value}
    return None


def _tensors(outputs: dict[str, np.ndarray]) -> dict[str, Any] | None:
    if len(outputs) != 1:
        return None
    (array,) = outputs.values()
    if array.size == 1:
        return _scalar(array.reshape(()).item() if array.dtype.kind in "iuf" else None)
    if array.ndim == 2 and array.shape[0] == 1 and array.dtype.kind in "iuf":
        return {"label": int(np.argmax(array[0]))}
    return None
