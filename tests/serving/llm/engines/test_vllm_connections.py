"""Pooled connections to an LLM engine (serving/llm/engines/vllm.py) that the engine closes.

vLLM's server closes a keep-alive connection idle for 5 s; a request the worker sends on such a
connection just as the engine closes it fails before any byte of the answer. The engine here is a raw
HTTP/1.1 server on a loopback port (asyncio streams, so the test decides exactly when a connection is
closed), answering completions as vLLM's OpenAI server shapes them. It stands in for vLLM only in when
it closes connections; tests/serving/llm runs the real vLLM.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from serving.llm.engines import vllm
from serving.llm.engines.vllm import VllmEngine
from serving.worker.errors import Unavailable
from serving.worker.runtime import Target

SERVED = "llama:1"


@dataclass
class Engine:
    """Closes a connection idle for ``idle_s``: with ``at_request`` when the next request comes (the close
    lost the race at the instant it is reused), else on a timer as uvicorn does. ``cut_answers``: send the
    status line and half the body, then close."""

    idle_s: float
    at_request: bool = False
    cut_answers: bool = False
    connections: int = 0
    answered: int = 0
    dropped: int = 0
    port: int = 0
    server: asyncio.AbstractServer | None = field(default=None, repr=False)

    async def start(self) -> "Engine":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        try:
            while True:
                try:
                    head = await (reader.readuntil(b"\r\n\r\n") if self.at_request
                                  else asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_s))
                except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                    return  # idle too long (the timer), or the client closed it
                if self.at_request and loop.time() - idle_since >= self.idle_s:
                    self.dropped += 1
                    return  # the request came on a connection already being closed: no answer
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                prompt = json.loads(await reader.readexactly(length))["prompt"]
                body = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": SERVED,
                                   "choices": [{"index": 0, "text": prompt.upper(), "finish_reason": "stop"}]}).encode()
                status = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                          % len(body))
                if self.cut_answers:
                    writer.write(status + body[: len(body) // 2])
                    await writer.drain()
                    self.dropped += 1
                    return
                writer.write(status + body)
                await writer.drain()
                self.answered += 1
                idle_since = loop.time()
        finally:
            writer.close()


def target(port: int) -> Target:
    return Target(model="llama", version=1, weight=100.0, triton_name="", artifact="", inputs=(), outputs=(),
                  engine_options={"url": f"http://127.0.0.1:{port}/v1", "served_model_name": SERVED})


async def complete(worker: VllmEngine, port: int, prompt: str) -> dict:
    return await worker.post(target(port), "completions", {"model": "chat", "prompt": prompt})


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_pooled_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one():
    async def scenario():
        engine = await Engine(idle_s=0.2, at_request=True).start()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            assert (await complete(worker, engine.port, "one"))["choices"][0]["text"] == "ONE"
            await asyncio.sleep(0.3)  # idle past the engine's keep-alive, within the worker's
            answer = await complete(worker, engine.port, "two")
            assert answer["choices"][0]["text"] == "TWO" and answer["model"] == "chat"
            assert (engine.dropped, engine.answered, engine.connections) == (1, 2, 2)
        finally:
            await worker.close()
            await engine.stop()
    run(scenario)


def test_an_answer_cut_after_its_first_byte_is_not_sent_again():
    """Once the engine answered anything, it may have generated: a 503, and the engine saw the request once."""
    async def scenario():
        engine = await Engine(idle_s=60, cut_answers=True).start()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            with pytest.raises(Unavailable, match="is not answering"):
                await complete(worker, engine.port, "one")
            assert (engine.dropped, engine.connections) == (1, 1)
        finally:
            await worker.close()
            await engine.stop()
    run(scenario)


def test_an_engine_that_refuses_connections_is_a_503_not_a_retry_loop():
    async def scenario():
        engine = await Engine(idle_s=60).start()
        port = engine.port
        await engine.stop()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            with pytest.raises(Unavailable, match="ClientConnectorError"):
                await complete(worker, port, "one")
        finally:
            await worker.close()
    run(scenario)


def test_the_pool_lets_go_of_idle_connections_before_the_engine_does(monkeypatch):
    """The engine keeps a connection for 5 s as vLLM does; the worker's pool lets go first, so a request
    after an idle spell goes on a new connection and nothing is dropped."""
    monkeypatch.setattr(vllm, "KEEPALIVE_S", 0.3)

    async def scenario():
        engine = await Engine(idle_s=5.0, at_request=True).start()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            await complete(worker, engine.port, "one")
            await asyncio.sleep(1.0)
            await complete(worker, engine.port, "two")
            assert (engine.dropped, engine.answered, engine.connections) == (0, 2, 2)
        finally:
            await worker.close()
            await engine.stop()
    run(scenario)


def test_requests_timed_at_the_engines_close_all_answer():
    """The race as it happens: the engine closes idle connections on a 0.25 s timer (shorter than the
    worker's keep-alive here), and bursts of requests are sent 0.25 s +/- 20 ms after the last answer, so
    some reach a connection as its timer fires. Every request is answered."""
    async def scenario():
        engine = await Engine(idle_s=0.25).start()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            prompts = [f"p{i}" for i in range(4)]
            for step in range(21):
                answers = await asyncio.gather(*(complete(worker, engine.port, p) for p in prompts))
                assert [a["choices"][0]["text"] for a in answers] == [p.upper() for p in prompts]
                await asyncio.sleep(0.23 + 0.002 * step)
            assert engine.answered == 21 * len(prompts)
        finally:
            await worker.close()
            await engine.stop()
    run(scenario)
