"""An engine's stream cut before its end is a failure, never an answer: the relay's reader
(serving/llm/engines/openai_stream.py) raises the engine's error when the connection ends without the
terminating chunk, whether the engine's process died (the kernel resets the connection) or closed it.
Should it end quietly instead, the worker would end the client's stream with ``[DONE]``: a truncated
answer with status 200. tests/serving/llm/test_replicas_e2e.py kills a real vLLM under load."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from serving.llm.engines.openai_stream import EngineStream, Upstream
from serving.worker.errors import BadGateway

EVENT = (b'data: {"id":"c","object":"text_completion","model":"served","choices":'
         b'[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}\n\n')


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_cut_stream(how: str, events: int = 5) -> tuple[int, Exception | None]:
    """A chunked event stream of ``events`` token events, then a reset (``abort``) or a close with no
    final chunk; what the reader made of it."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(events):
            writer.write(chunk(EVENT))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.transport.abort() if how == "abort" else writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    read, error = 0, None
    try:
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"http://127.0.0.1:{port}/v1/completions", json={})
            stream = EngineStream(response, Upstream(f"http://127.0.0.1:{port}/v1", "served"), "public",
                                  lambda exc: BadGateway(f"the engine failed: {exc}"))
            try:
                async for batch in stream.batches():
                    read += batch.content
            except BadGateway as exc:
                error = exc
            finally:
                await stream.aclose()
    finally:
        server.close()
        await server.wait_closed()
    return read, error


@pytest.mark.parametrize("how", ["abort", "close"])
def test_a_stream_cut_before_its_final_chunk_raises_the_engines_error(how):
    read, error = asyncio.run(read_cut_stream(how))
    assert read == 5, "the tokens before the cut were passed on"
    assert isinstance(error, BadGateway) and "the engine failed" in str(error), error
