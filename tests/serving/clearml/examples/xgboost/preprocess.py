"""Fixture for the ``xgboost`` engine: the request becomes an ``xgboost.DMatrix`` here.

Request: the four measurements ``{"x0": .., "x1": .., "x2": .., "x3": ..}`` of one flower. The row
count travels to ``postprocess`` in the per-request ``state`` dict.
"""
import numpy as np
import xgboost

MEASUREMENTS = ("x0", "x1", "x2", "x3")


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        matrix = np.array([[float(body[m]) for m in MEASUREMENTS]], dtype=np.float32)
        state["rows"] = matrix.shape[0]
        return xgboost.DMatrix(matrix)

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"y": np.asarray(data).tolist(), "rows": state["rows"]}
