"""Fixture for the ``custom`` engine: every synchronous hook, and a statistic of each kind.

``load`` keeps the pickled classifier; ``process`` runs it (the worker runs no model of its own for
``custom``); ``unload`` lets it go when the endpoint drops this instance. Request:
``{"features": [a, b, c]}``; answer the class and its probability. Statistics: ``label`` (an enum,
``--variable-enum``), ``confidence`` (a value, ``--variable-value``) and ``width`` (a scalar,
``--variable-scalar``).
"""
import joblib
import numpy as np

LABELS = ("left", "right")


class Preprocess:
    def __init__(self):
        self.classifier = None
        self.unloaded = False

    def load(self, local_file_name):
        self.classifier = joblib.load(local_file_name)

    def unload(self):
        self.classifier = None
        self.unloaded = True

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        features = body.get("features") if isinstance(body, dict) else None
        if not isinstance(features, list) or len(features) != 3:
            raise ValueError("the body needs 'features': a list of 3 numbers")
        if collect_custom_statistics_fn:
            collect_custom_statistics_fn({"width": max(features) - min(features)})
        return np.asarray([features], dtype=np.float64)

    def process(self, data, state, collect_custom_statistics_fn=None):
        probabilities = self.classifier.predict_proba(data)[0]
        state["label"] = LABELS[int(probabilities.argmax())]
        return probabilities

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        confidence = float(np.max(data))
        if collect_custom_statistics_fn:
            collect_custom_statistics_fn({"label": state["label"], "confidence": confidence})
        return {"label": state["label"], "confidence": confidence}
