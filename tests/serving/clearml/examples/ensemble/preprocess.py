"""Fixture for the ``sklearn`` engine with ``load``: a voting ensemble of regressors.

``load`` opens the pickle itself and returns the estimator, which the worker then uses in place of
the file. Request: one point ``{"x0": .., "x1": ..}`` or several ``{"points": [[x0, x1], ...]}``;
answer ``{"y": [one value per point]}``.
"""
import joblib
import numpy as np


class Preprocess:
    def load(self, local_file_name):
        return joblib.load(local_file_name)

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        points = body["points"] if "points" in body else [[body["x0"], body["x1"]]]
        return np.asarray(points, dtype=np.float64).reshape(-1, 2)

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"y": [float(v) for v in np.ravel(data)]}
