"""Reading an engine's Server-Sent Events (serving/llm/engines/sse.py) and relaying them
(vllm.py EngineStream): line ends, events cut between reads, and the model's name."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from serving.llm.engines.sse import SseEvent, read_events
from serving.llm.engines.vllm import EngineStream, Upstream
from serving.worker.errors import BadGateway, Unavailable

# characters str.splitlines() breaks at and JSON leaves as they are: a model may generate any of them
ODD = "a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci"


async def chunks_of(*parts: bytes):
    for part in parts:
        yield part


def read(*parts: bytes) -> list[list[SseEvent]]:
    async def collect():
        return [batch async for batch in read_events(chunks_of(*parts))]
    return asyncio.run(collect())


def test_only_cr_and_lf_end_a_line():
    data = orjson.dumps({"text": ODD})
    assert read(b"data: " + data + b"\n\n") == [[SseEvent(data)]]
    assert orjson.loads(read(b"data: " + data + b"\n\n")[0][0].data)["text"] == ODD


def test_events_of_one_read_come_together_and_a_cut_event_waits_for_its_rest():
    batches = read(b"data: 1\n\ndata: 2\n\ndata: 3", b"4\n", b"\ndata: [DONE]\n\n")
    assert batches == [[SseEvent(b"1"), SseEvent(b"2")], [SseEvent(b"34"), SseEvent(b"[DONE]")]]


@pytest.mark.parametrize("end", [b"\r\n", b"\n", b"\r"])
def test_every_line_end_of_the_standard(end):
    stream = b": a comment" + end + b"event: x" + end + b"data:1" + end + b"data: 2" + end + end
    assert read(stream) == [[SseEvent(b"1\n2")]]
    assert read(stream[:-1], stream[-1:]) == [[SseEvent(b"1\n2")]]  # the empty line cut between reads


def test_a_last_event_without_its_empty_line_still_counts():
    assert read(b"data: 1\n\ndata: 2") == [[SseEvent(b"1")], [SseEvent(b"2")]]


def stream_of(body: bytes, served: str = "llama:1", public: str = "chat") -> list:
    """``body`` sent by a real HTTP server on a loopback port (aiohttp's, standing in for the engine's
    bytes), read by the worker's EngineStream."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="text/event-stream")

    async def events():
        app = web.Application()
        app.router.add_post("/v1/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                response = await session.post(f"http://127.0.0.1:{port}/v1/completions")
                stream = EngineStream(response, Upstream(f"http://127.0.0.1:{port}/v1", served), public,
                                      lambda exc: Unavailable(str(exc)))
                try:
                    return [item async for batch in stream.batches() for item in batch]
                finally:
                    await stream.aclose()
        finally:
            await runner.cleanup()
    return asyncio.run(events())


def test_the_model_is_renamed_in_place_and_the_rest_kept_byte_for_byte():
    event = b'{"id":"c1","model":"llama:1","choices":[{"index":0,"text":"\\"model\\":\\"llama:1\\""}]}'
    items = stream_of(b"data: " + event + b"\n\ndata: [DONE]\n\n")
    assert items[0].data == event.replace(b'"model":"llama:1"', b'"model":"chat"', 1)
    assert items[0].event["model"] == "chat"
    assert items[0].event["choices"][0]["text"] == '"model":"llama:1"'  # the text is the model's own
    assert items[1].event is None


def test_an_engine_that_writes_spaces_still_gets_its_model_renamed():
    items = stream_of(b'data: {"model": "llama:1", "choices": []}\n\n')
    assert orjson.loads(items[0].data) == {"model": "chat", "choices": []}


def test_an_event_that_is_not_json_is_a_bad_gateway():
    with pytest.raises(BadGateway, match="not JSON"):
        stream_of(b'data: {"model": "llama:1", "cho\n\n')
