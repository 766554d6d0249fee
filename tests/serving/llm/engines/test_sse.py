"""Reading an engine's Server-Sent Events (serving/llm/engines/sse.py) and relaying them
(openai_stream.py EngineStream): line ends, events cut between reads, the model's name, and which reads
go on as their bytes (tokens only) and which are parsed event by event."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from serving.llm.engines.sse import SseEvent, read_events
from serving.llm.engines.openai_stream import EngineStream, Upstream
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
    bytes), read by the worker's EngineStream: its events."""
    return [item for batch in batches_of(body, served, public) for item in batch.events()]


def batches_of(body: bytes, served: str = "llama:1", public: str = "chat") -> list:
    """As :func:`stream_of`, the batches themselves (one read of a short body: one batch)."""
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
                    return [batch async for batch in stream.batches()]
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


def token(text: str, model: str = "llama:1", finish: str | None = None) -> bytes:
    """A completions chunk as vLLM writes it (no spaces)."""
    return b"data: " + orjson.dumps({"id": "c1", "object": "text_completion", "model": model, "choices": [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}) + b"\n\n"


def test_a_read_of_tokens_goes_on_as_its_bytes_renamed_with_its_tokens_counted():
    body = token("Hel") + token('"model":"llama:1"') + token("") + token("lo")
    (batch,) = batches_of(body)
    assert batch.data == body.replace(b'"model":"llama:1"', b'"model":"chat"')  # the text's quotes are escaped
    assert batch.content == 3  # the empty text is no token
    assert [item.event["choices"][0]["text"] for item in batch.events()] == ["Hel", '"model":"llama:1"', "", "lo"]
    assert all(item.event["model"] == "chat" for item in batch.events())


@pytest.mark.parametrize("last", [
    token("", finish="length"),  # a finish reason
    b'data: {"id":"c1","model":"llama:1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
    b'data: {"model": "llama:1", "choices": []}\n\n',  # another writer's spaces: its model renamed all the same
    b'data: {"id":"c1","model":"other","choices":[]}\n\n',  # another model's name: left as it is
], ids=["finish", "usage", "done", "spaces", "other-model"])
def test_a_read_with_anything_but_tokens_is_parsed_event_by_event(last):
    (batch,) = batches_of(token("a") + last)
    assert batch.data is None and len(batch.events()) == 2
    assert batch.events()[0].data == token("a", "chat")[6:-2]


def test_a_plain_read_is_checked_by_its_shape_only_until_its_events_are_read():
    """The price of not parsing: a line that looks like a JSON object naming the model goes on unread (a
    cut event, which does not end with its brace, is refused above); a shadow that reads it gets the 502."""
    (batch,) = batches_of(token("a") + b'data: {"model":"llama:1","cho}\n\n')
    assert batch.data is not None
    with pytest.raises(BadGateway, match="not JSON"):
        batch.events()
