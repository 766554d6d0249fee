"""What an answer predicted, as feedback is scored against it (serving/prediction_log/prediction.py)."""
from __future__ import annotations

import numpy as np
import pytest


from serving.prediction_log.prediction import predicted


@pytest.mark.parametrize("answer,want", [
    ({"label": "POSITIVE", "score": 0.9}, {"label": "POSITIVE"}),
    ({"label": 1}, {"label": 1}),
    ({"prediction": 2.5}, {"value": 2.5}),
    ({"prediction": "cat"}, {"label": "cat"}),
    ({"value": 3}, {"label": 3}),
    ({"predictions": [{"label": "a"}]}, {"label": "a"}),
    ({"y": [0.2]}, None),
    ([[7]], {"label": 7}),
    (0.25, {"value": 0.25}),
    ({"logits": np.array([[0.1, 2.0, -1.0]], dtype=np.float32)}, {"label": 1}),
    ({"out": np.array([[3.5]], dtype=np.float32)}, {"value": 3.5}),
    ({"a": np.zeros((1, 2)), "b": np.zeros((1, 2))}, None),
    ({"predictions": [{"label": "a"}, {"label": "b"}]}, None),
    ("an LLM's text is not a class", {"label": "an LLM's text is not a class"}),
])
def test_the_prediction_of_an_answer(answer, want):
    assert predicted(answer) == want
