"""The ``Preprocess`` hooks as the worker's user-code runtime (preprocess/user_code.py) calls them,
in-process on the fixtures: what each hook receives and when. test_examples.py covers the same
fixtures over sockets; this is where a hook's timing is looked at directly."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from preprocess.user_code import UserContext, UserProcessor
from tests.serving.clearml.models import EXAMPLES, sklearn_logistic


def _run(coroutine):
    return asyncio.run(coroutine)


def test_load_gets_the_model_file_and_model_endpoint_is_set_first(tmp_path):
    seen: list = []

    def send_request(endpoint, version=None, data=None):
        seen.append((endpoint, version, data))
        return {"y": [1]}

    model = sklearn_logistic(tmp_path, n_features=3)
    processor = UserProcessor(EXAMPLES / "custom/preprocess.py",
                              UserContext(model_file=model, endpoint={"engine_type": "custom", "serving_url": "c"},
                                          send_request=send_request, timeout_s=5))
    try:
        user = processor.user
        assert user.classifier is not None and user.model_endpoint.serving_url == "c"
        assert user.send_request("other", "2", {"a": 1}) == {"y": [1]} and seen == [("other", "2", {"a": 1})]
        collected: dict = {}
        state: dict = {}
        data = _run(processor.preprocess({"features": [1, 2, 3]}, state, collected.update))
        data = _run(processor.process(data, state, collected.update))
        answer = _run(processor.postprocess(data, state, collected.update))
        assert answer["label"] == state["label"] == collected["label"]
        assert collected["width"] == 2 and collected["confidence"] == answer["confidence"]
    finally:
        processor.close()


def test_template_passes_everything_through():
    processor = UserProcessor(EXAMPLES / "preprocess_template/preprocess_template.py")
    try:
        assert processor.loaded is None and processor.has_process
        for body in ({"a": [1, 2]}, b"\x00raw bytes"):
            state: dict = {}
            out = _run(processor.postprocess(_run(processor.process(_run(processor.preprocess(body, state, None)),
                                                                     state, None)), state, None))
            assert out == body
    finally:
        processor.close()


def test_unload_runs_once_when_the_processor_is_closed(tmp_path: Path):
    processor = UserProcessor(EXAMPLES / "custom/preprocess.py",
                              UserContext(model_file=sklearn_logistic(tmp_path, n_features=3)))
    user = processor.user
    calls = []
    unload = user.unload
    user.unload = lambda: calls.append(unload())
    processor.close()
    processor.close()  # retired twice (a replace, then shutdown): unloaded once, as ClearML's instance
    assert user.unloaded and user.classifier is None and len(calls) == 1


def test_a_failing_unload_is_logged_not_raised(tmp_path: Path, caplog):
    source = tmp_path / "preprocess.py"
    source.write_text("class Preprocess:\n    async def unload(self):\n        raise RuntimeError('disk gone')\n")
    processor = UserProcessor(source)
    with caplog.at_level("ERROR", logger="preprocess.user_code"):
        processor.close()
    assert "unload() in preprocess.py failed" in caplog.text and "disk gone" in caplog.text
