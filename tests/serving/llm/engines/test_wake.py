"""Requests for an LLM engine scaled to zero are held while it wakes (serving/llm/engines/wake.py).

Stand-ins, each an aiohttp server on a real loopback socket: a launcher whose engine ``tiny:1`` starts
``scaled_to_zero``, turns ``starting`` with ``waking`` on ``POST /engines/wake`` and ``ready`` (one replica)
after ``wake_s``; and behind it an OpenAI engine answering chat completions as vLLM shapes them. The real
launcher (serving/llm/kube/engines.py) is tested on the cluster; here the worker's side goes through the
engine's own paths (``VllmEngine.post`` and ``stream``, ``is_ready``).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable

import pytest
from aiohttp import web

from serving.llm.engines import hold_metrics, wake
from serving.llm.engines.vllm import VllmEngine, served_name
from serving.llm.engines.wake import HoldLimits
from serving.worker.errors import Unavailable
from serving.worker.load import InFlight, metrics_text
from serving.worker.runtime import Target

TARGET = Target(model="tiny", version=1, weight=100.0, triton_name="", artifact="", inputs=(), outputs=())
KEY = served_name(TARGET)  # "tiny:1"


async def _listen(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


class OpenAIEngine:
    """Answers ``POST /v1/chat/completions`` (plain or streamed) with the last message upper-cased."""

    def __init__(self) -> None:
        self.answered = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = body["messages"][-1]["content"].upper()
        self.answered += 1
        if not body.get("stream"):
            return web.json_response({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": text}}]})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"],
                 "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner, url = await _listen(app)
        return f"{url}/v1"


class Launcher:
    """``GET /engines`` and ``POST /engines/wake`` for one engine, ``KEY``. ``wake_s``: from the wake call to
    ``ready``; None: it never gets there. ``deaf``: wake calls are answered 202 and change nothing."""

    def __init__(self, engine_url: str, wake_s: float | None = 1.0, deaf: bool = False) -> None:
        self.engine_url, self.wake_s, self.deaf = engine_url, wake_s, deaf
        self.entry: dict[str, Any] = {"url": None, "served_model_name": KEY, "state": "scaled_to_zero",
                                      "waking": False, "error": None, "replicas": []}
        self.reads = self.wakes = 0
        self.flip: asyncio.Task | None = None

    async def engines(self, request: web.Request) -> web.Response:
        self.reads += 1
        return web.json_response({"engines": {KEY: self.entry}})

    async def wake(self, request: web.Request) -> web.Response:
        key = (await request.json()).get("engine")
        if key != KEY:
            return web.json_response({"detail": f"no engine {key!r} here that can be woken"}, status=404)
        self.wakes += 1
        if self.entry["state"] == "scaled_to_zero" and not self.deaf:
            self.entry = {**self.entry, "state": "starting", "waking": True}
            if self.wake_s is not None:
                self.flip = asyncio.create_task(self._ready_after(self.wake_s))
        return web.json_response({"engine": key, "state": "starting"}, status=202)

    async def _ready_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        replica = {"id": "0", "url": self.engine_url, "state": "ready", "error": None, "adapters": []}
        self.entry = {**self.entry, "url": self.engine_url, "state": "ready", "waking": False, "replicas": [replica]}

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/engines", self.engines)
        app.router.add_post("/engines/wake", self.wake)
        self.runner, url = await _listen(app)
        return url


Scenario = Callable[[VllmEngine, Launcher, OpenAIEngine], Awaitable[None]]


def run(scenario: Scenario, limits: HoldLimits = HoldLimits(), **launcher: Any) -> None:
    async def main() -> None:
        engine = OpenAIEngine()
        stand_in = Launcher(await engine.start(), **launcher)
        worker = VllmEngine(await stand_in.start(), timeout_s=30.0, counter=None, hold=limits)  # no prompt counted
        try:
            await scenario(worker, stand_in, engine)
        finally:
            await worker.close()
            if stand_in.flip is not None:
                stand_in.flip.cancel()
            await stand_in.runner.cleanup()
            await engine.runner.cleanup()
    asyncio.run(asyncio.wait_for(main(), 60))


def chat(worker: VllmEngine, text: str) -> Awaitable[dict[str, Any]]:
    return worker.post(TARGET, "chat/completions", {"model": "chat", "messages": [{"role": "user", "content": text}]})


@pytest.fixture(autouse=True)
def stats(monkeypatch: pytest.MonkeyPatch) -> hold_metrics.HoldStats:
    """This test's own numbers: the process's are left as they were (the worker's /metrics tests read them)."""
    own = hold_metrics.HoldStats()
    monkeypatch.setattr(wake, "HOLD_STATS", own)
    return own


def outcomes() -> dict[str, int]:
    return dict(wake.HOLD_STATS.outcomes.get(KEY, {}))


async def until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_requests_held_for_a_sleeping_engine_are_all_answered_after_one_wake_call():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        started = time.monotonic()
        streamed = asyncio.create_task(_streamed(worker, "streamed"))
        answers = await asyncio.gather(*(chat(worker, f"p{i}") for i in range(12)))
        assert [a["choices"][0]["message"]["content"] for a in answers] == [f"P{i}" for i in range(12)]
        assert all(a["model"] == "chat" for a in answers)  # the client's name, as for any answer
        assert await streamed == "STREAMED"
        assert time.monotonic() - started >= 1.0  # held until the flip, not refused
        assert launcher.wakes == 1 and engine.answered == 13
        # the held requests share one reader of the map: about one read per POLL_S, not one per request
        assert launcher.reads <= 2 + (time.monotonic() - started) / wake.POLL_S + 2
        assert worker.holds.held(KEY) == 0 and wake.HOLD_STATS.held.get(KEY) == 0
        assert (await chat(worker, "after"))["choices"][0]["message"]["content"] == "AFTER"  # not held: ready
    run(scenario)
    assert outcomes() == {"answered": 13}
    assert sum(wake.HOLD_STATS.counts[KEY]) == 13 and 0.9 <= wake.HOLD_STATS.sums[KEY] / 13 < 2.0


async def _streamed(worker: VllmEngine, text: str) -> str:
    stream = await worker.stream(TARGET, "chat/completions",
                                 {"model": "chat", "stream": True, "messages": [{"role": "user", "content": text}]})
    content = ""
    try:
        async for batch in stream.batches():
            for item in batch.parse():
                if item.event is not None:
                    content += "".join(c["delta"].get("content") or "" for c in item.event["choices"])
    finally:
        await stream.aclose()
    return content


def test_past_hold_max_a_request_is_refused_at_once_with_retry_after():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        held = [asyncio.create_task(chat(worker, f"p{i}")) for i in range(2)]
        await until(lambda: worker.holds.held(KEY) == 2)
        started = time.monotonic()
        with pytest.raises(Unavailable, match="starting from zero; 2 requests are already waiting") as refused:
            await chat(worker, "third")
        assert time.monotonic() - started < 0.3 and refused.value.retry_after_s
        assert all(await asyncio.gather(*held))  # the two held still get their answers
    run(scenario, HoldLimits(max_held=2), wake_s=0.6)
    assert outcomes() == {"refused_full": 1, "answered": 2}


def test_a_request_held_past_hold_s_is_refused_and_the_wake_is_sent_again(monkeypatch):
    monkeypatch.setattr(wake, "WAKE_AGAIN_S", 0.3)
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        started = time.monotonic()
        with pytest.raises(Unavailable, match="did not become ready within 1.2 s") as refused:
            await chat(worker, "p")
        assert 1.1 <= time.monotonic() - started < 2.0 and refused.value.retry_after_s
        assert 3 <= launcher.wakes <= 5  # still asleep: the wake goes again every WAKE_AGAIN_S, one at a time
        assert engine.answered == 0 and worker.holds.held(KEY) == 0
    run(scenario, HoldLimits(hold_s=1.2), deaf=True)
    assert outcomes() == {"timed_out": 1}


def test_an_engine_woken_but_never_ready_is_a_503_after_hold_s():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        with pytest.raises(Unavailable, match="did not become ready within 0.8 s"):
            await chat(worker, "p")
        assert launcher.wakes == 1  # the launcher says it is waking: no call again
    run(scenario, HoldLimits(hold_s=0.8), wake_s=None)


def test_a_cancelled_held_request_frees_its_place():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        first = asyncio.create_task(chat(worker, "gone"))
        await until(lambda: worker.holds.held(KEY) == 1)
        first.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await first
        assert worker.holds.held(KEY) == 0 and wake.HOLD_STATS.held.get(KEY) == 0
        answer = await chat(worker, "next")  # its place is free: held, not refused
        assert answer["choices"][0]["message"]["content"] == "NEXT" and engine.answered == 1
    run(scenario, HoldLimits(max_held=1), wake_s=0.6)
    assert outcomes() == {"cancelled": 1, "answered": 1}


def test_an_engine_that_fails_while_held_refuses_its_requests_with_its_error():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        held = asyncio.create_task(chat(worker, "p"))
        await until(lambda: launcher.wakes == 1)
        launcher.entry = {**launcher.entry, "state": "failed", "waking": False, "error": "out of memory"}
        with pytest.raises(Unavailable, match="is failed: out of memory"):
            await held
    run(scenario, wake_s=None)
    assert outcomes() == {"failed": 1}


def test_a_sleeping_engine_is_ready_for_the_gate_a_first_start_and_a_failure_are_not():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        states = [({"state": "scaled_to_zero"}, True), ({"state": "starting", "waking": True}, True),
                  ({"state": "starting", "waking": False}, False), ({"state": "failed"}, False)]
        for change, routable in states:
            launcher.entry = {**launcher.entry, **change}
            assert await worker.ready(TARGET) is routable, change
        assert launcher.wakes == 0  # the gate only reads
    run(scenario)


def test_a_first_start_is_not_held():
    async def scenario(worker: VllmEngine, launcher: Launcher, engine: OpenAIEngine) -> None:
        launcher.entry = {**launcher.entry, "state": "starting", "waking": False}
        started = time.monotonic()
        with pytest.raises(Unavailable, match="is starting"):
            await chat(worker, "p")
        assert time.monotonic() - started < 0.5 and launcher.wakes == 0
    run(scenario)


class Exchange:
    """Two worker processes' payloads, as serving/worker/app.py's statistics exchange gathers them."""

    def __init__(self, *payloads: dict[str, Any]) -> None:
        self.payloads = list(payloads)

    async def gather(self) -> list[dict[str, Any]]:
        return self.payloads


def test_the_workers_metrics_sum_every_processes_holds():
    one, two = hold_metrics.HoldStats(), hold_metrics.HoldStats()
    one.begin("a:1")
    one.outcome("a:1", "answered", 3.0)
    two.begin("a:1")
    two.outcome("a:1", "answered", 40.0)
    two.outcome("a:1", "refused_full")
    exchange = Exchange({"in_flight": 0, "llm_hold": one.snapshot()}, {"in_flight": 1, "llm_hold": two.snapshot()})
    text = asyncio.run(metrics_text(InFlight(exchange=exchange), hold_metrics.collector)).decode()
    assert "serving_worker_requests_in_flight 1.0" in text and "serving_worker_processes 2.0" in text
    assert 'serving_llm_held_requests_now{engine="a:1"} 2.0' in text
    assert 'serving_llm_held_requests_total{engine="a:1",outcome="answered"} 2.0' in text
    assert 'serving_llm_held_requests_total{engine="a:1",outcome="refused_full"} 1.0' in text
    assert 'serving_llm_hold_seconds_bucket{engine="a:1",le="5.0"} 1.0' in text
    assert 'serving_llm_hold_seconds_bucket{engine="a:1",le="+Inf"} 2.0' in text
    assert 'serving_llm_hold_seconds_sum{engine="a:1"} 43.0' in text
