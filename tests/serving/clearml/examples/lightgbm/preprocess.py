"""Fixture for the ``lightgbm`` engine: a three-class booster's most likely class.

Request: ``{"x0": .., "x1": .., "x2": .., "x3": ..}``; answer the class index and its probability.
"""
import numpy as np


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return np.array([[body[f"x{i}"] for i in range(4)]], dtype=np.float32)

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        probabilities = np.asarray(data).reshape(-1)
        best = int(probabilities.argmax())
        return {"y": best, "p": float(probabilities[best])}
