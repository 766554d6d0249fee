"""Fixture for a ``custom`` pipeline: asks two other endpoints with ``send_request``, averages them.

The worker replaces ``send_request`` with its own before the first request; it returns the other
endpoint's JSON answer, or None when that call failed. The two calls run side by side on a thread
pool, and name their endpoints in both forms ClearML accepts: ``/name/`` with no version, and a
bare name with a version.
"""
from concurrent.futures import ThreadPoolExecutor

TARGETS = (("/test_model_sklearn_a/", None), ("test_model_sklearn_b", "1"))


class Preprocess:
    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=len(TARGETS))

    def process(self, data, state, collect_custom_statistics_fn=None):
        calls = [self.pool.submit(self.send_request, endpoint=name, version=version, data=data)
                 for name, version in TARGETS]
        answers = [call.result() for call in calls]
        failed = [name for (name, _), answer in zip(TARGETS, answers) if not answer]
        if failed:
            raise RuntimeError(f"no answer from {', '.join(failed)}")
        return answers

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        values = [answer["y"][0] for answer in data]
        return {"y": sum(values) / len(values)}

    def send_request(self, endpoint, version=None, data=None):
        return None  # stand-in; the serving runtime sets the real one
