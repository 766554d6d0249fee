"""Fixture for the ``sklearn`` engine: two named numbers in, the classifier's labels out.

Request: ``{"x0": 1, "x1": 2}``. The worker calls ``model.predict`` on what ``preprocess`` returns
(one row); both inputs go to the statistics collector, where ``metrics add --variable-scalar``
histograms them.
"""
import numpy as np

COLUMNS = ("x0", "x1")


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        row = [body.get(column) for column in COLUMNS]
        if collect_custom_statistics_fn:
            collect_custom_statistics_fn(dict(zip(COLUMNS, row)))
        return [row]

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"y": np.asarray(data).tolist()}
