"""Fixture: a ``Preprocess`` with every hook of the interface, each passing its input through.

Deployed with ``--engine custom`` and no model, it answers what it was sent: a JSON body as JSON,
raw bytes as ``application/octet-stream``. Hooks, in the order the worker calls them:

* ``__init__()``: once per endpoint version, before any request;
* ``load(local_file_name)``: once, with the model file's path (None without a model); what it
  returns becomes the model of an in-process engine;
* ``preprocess(body, state, collect_custom_statistics_fn)``: ``body`` is the decoded JSON or the
  raw bytes, ``state`` a dict private to this request, ``collect_custom_statistics_fn`` a callable
  taking ``{variable: value}`` (or None);
* ``process(data, state, collect_custom_statistics_fn)``: ``custom`` engines only, in place of a model;
* ``postprocess(data, state, collect_custom_statistics_fn)``: what it returns is the answer;
* ``unload()``: when the endpoint version is dropped;
* ``send_request(endpoint, version, data)``: set by the worker, calls another endpoint.
"""


class Preprocess:
    def __init__(self):
        self.model = None

    def load(self, local_file_name):
        return None

    def unload(self):
        self.model = None

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return body

    def process(self, data, state, collect_custom_statistics_fn=None):
        return data

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return data

    def send_request(self, endpoint, version=None, data=None):
        return None
