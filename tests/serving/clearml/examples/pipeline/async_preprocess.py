"""Fixture for a ``custom_async`` pipeline: the same average as preprocess.py, as coroutines.

Every hook is ``async``; ``send_request`` is awaited, both calls at once.
"""
import asyncio

TARGETS = (("/test_model_sklearn_a/", None), ("test_model_sklearn_b", "1"))


class Preprocess:
    async def preprocess(self, body, state, collect_custom_statistics_fn=None):
        missing = [key for key in ("x0", "x1") if key not in body]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return body

    async def process(self, data, state, collect_custom_statistics_fn=None):
        answers = await asyncio.gather(*(self.send_request(endpoint=name, version=version, data=data)
                                         for name, version in TARGETS))
        failed = [name for (name, _), answer in zip(TARGETS, answers) if not answer]
        if failed:
            raise RuntimeError(f"no answer from {', '.join(failed)}")
        return answers

    async def postprocess(self, data, state, collect_custom_statistics_fn=None):
        values = [answer["y"][0] for answer in data]
        return {"y": sum(values) / len(values)}

    async def send_request(self, endpoint, version=None, data=None):
        return None  # stand-in; the serving runtime sets the real one
