"""The platform's W0 endpoint: ``serving model add --endpoint echo --engine custom --preprocess`` this file.

A ClearML-style ``Preprocess`` whose three steps return what they get: the request's JSON
comes back as the answer, through routing, user code and statistics like any request.
"""


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return body

    def process(self, data, state, collect_custom_statistics_fn=None):
        return data

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return data
