"""LLM shadow copies without an engine: the agreement score, the stream's text, and the copy's
lifecycle (started after the live answer, in the background, bounded). The engine here is a stand-in
object whose answer the test releases by hand: that is what makes ordering assertable without timings;
the real-vLLM path is in tests/serving/llm/test_llm_rollouts_e2e.py."""
from __future__ import annotations

import asyncio

import pytest

from serving.statistics.events import parse_event
from serving.llm.relay.shadow_compare import LlmShadow, StreamText, agreement, choice_texts, is_greedy, token_f1
from serving.worker.runtime import Target
from serving.worker.shadow import ShadowMirror


@pytest.mark.parametrize("request_, greedy", [
    ({"temperature": 0}, True), ({"temperature": 0.0, "top_p": 0.5}, True), ({"top_k": 1}, True),
    ({}, False), ({"temperature": 0.7}, False), ({"top_k": 5}, False), ({"temperature": None}, False),
])
def test_greedy_is_temperature_0_or_top_k_1(request_, greedy):
    assert is_greedy(request_) is greedy


def test_token_f1_is_a_bag_f1_over_whitespace_tokens():
    assert token_f1("a b c", "a b c") == 1.0
    assert token_f1("a b c", "c b a") == 1.0  # a bag: order does not count
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # precision 2/3, recall 2/3
    assert token_f1("a b", "c d") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("a", "") == 0.0


def test_agreement_exact_for_greedy_overlap_otherwise():
    live, same, other = {0: "the cat sat"}, {0: "the cat sat"}, {0: "the dog sat"}
    assert agreement({"temperature": 0}, live, same) == 1.0
    assert agreement({"temperature": 0}, live, other) == 0.0  # greedy: one right text, no partial credit
    assert agreement({}, live, other) == pytest.approx(2 / 3)
    assert agreement({}, {0: "a", 1: "b"}, {0: "a"}) == 0.5  # a missing choice scores 0


def test_texts_of_plain_answers_and_streams():
    assert choice_texts({"choices": [{"index": 0, "text": "x y"}]}) == {0: "x y"}
    assert choice_texts({"choices": [{"index": 0, "message": {"content": "hi"}}]}) == {0: "hi"}
    text = StreamText()
    for event in [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "he"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "llo"}}]}, {"choices": [], "usage": {}}]:
        text.add(event)
    assert text.texts() == {0: "hello"}


class HeldEngine:
    """Answers each copy only when the test releases it."""

    kind = "llm"

    def __init__(self, text: str) -> None:
        self.text, self.release, self.calls = text, asyncio.Event(), []

    async def post(self, target, route, body):
        self.calls.append((target.version, body))
        await self.release.wait()
        return {"choices": [{"index": 0, "text": self.text}]}


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def record(self, event: dict) -> None:
        self.events.append(parse_event(event).to_dict())


class Endpoint:
    name, engine, preprocess_kind = "chat", "vllm", "builtin"

    def __init__(self, shadow: Target) -> None:
        self.shadows = [shadow]


def test_a_copy_runs_in_the_background_bounded_and_is_scored():
    async def scenario():
        engine, recorder = HeldEngine("the dog sat"), Recorder()
        mirror = ShadowMirror(None, {}, lambda: recorder, max_in_flight=1)
        shadow = LlmShadow(mirror, {"vllm": engine})
        live = Target("m", 1, 100.0, "", "", (), ())
        ep = Endpoint(Target("m", 2, 100.0, "", "", (), (), role="shadow"))
        request = {"model": "chat", "prompt": "p", "stream": True, "stream_options": {"include_usage": True}}
        first = shadow.pick(ep, "completions", request)
        shadow.fire(first, live, "completions", {0: "the cat sat"})  # returns with the copy still unanswered
        await asyncio.sleep(0)
        assert engine.calls == [(2, {"model": "chat", "prompt": "p", "stream": False})]  # never streamed
        shadow.fire(shadow.pick(ep, "completions", request), live, "completions", {0: "x"})  # past the bound
        assert [e["shadow"]["dropped"] for e in recorder.events] == [True]
        engine.release.set()
        await mirror.drain()
        done = recorder.events[-1]
        assert done["status"] == 200 and done["version"] == 2 and done["shadow"]["live_version"] == 1
        assert done["shadow"]["agreement"] == pytest.approx(2 / 3) and done["shadow"]["agree"] is False
        assert shadow.pick(ep, "embeddings", {"model": "chat", "input": "x"}) is None  # no text to compare

    asyncio.run(scenario())
