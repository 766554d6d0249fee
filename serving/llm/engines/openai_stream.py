"""An OpenAI-compatible engine's stream, as the relay reads it (api.py's GenerationStream): vLLM's, or any
server that writes chat and completion chunks as vLLM does.

Why read the bytes before the events: at a GPU's rate a worker relays tens of thousands of events a
second, and parsing each one (JSON, then the relay's look at it) cost it three times a bare pass-through
(benchmarks/llm_relay_rate.py). Most reads hold only token events, one ``data:`` line each, a JSON
object naming the model as vLLM writes it. Such a read is passed on as it came, its model renamed in
place and its tokens counted on the bytes. A read with anything else (the end, the usage chunk, a finish
reason, another shape) is parsed event by event, as before.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import aiohttp
import orjson

from serving.llm.engines.api import StreamBatch, StreamEvent
from serving.llm.engines.sse import DONE, SseEvent, read_blocks, split_block
from serving.worker.errors import BadGateway, ServingError, brief

# what makes a read more than tokens: the relay must look at its events
SPECIAL = (DONE, b'"usage":{', b'"finish_reason":"', b'"error"')
# a token the client gets now: completions' text, chat's content or tool calls; quotes inside a JSON
# string are escaped, so these byte strings are keys and never part of a generated text
_CONTENT = (b'"text":"', b'"content":"', b'"tool_calls":[')
_EMPTY = (b'"text":""', b'"content":""')


def content_events(block: bytes) -> int:
    """How many events of a plain read carry a token (one choice each, as a stream without ``n`` has)."""
    return sum(map(block.count, _CONTENT)) - sum(map(block.count, _EMPTY))


@dataclass(frozen=True)
class Upstream:
    url: str                # the engine's OpenAI base URL, ending in /v1
    served_model_name: str  # the model's name at the engine


class EngineStream:
    """An engine's Server-Sent Events, the events of one read together (sse.py), with the model's name
    rewritten back in place (the event is not written again); closing it closes the upstream connection.
    A read of token events only, each one ``data:`` line of a JSON object naming the model as vLLM writes
    it, is passed on as it came, with its tokens counted on the bytes (:func:`content_events`); any other
    read is parsed event by event (api.py's StreamBatch)."""

    def __init__(self, response: aiohttp.ClientResponse, up: Upstream, public: str,
                 failed: Callable[[Exception], ServingError], done: Callable[[], None] = lambda: None) -> None:
        self.response, self.up, self.public, self.failed, self.done = response, up, public, failed, done
        self._served_field = b'"model":' + orjson.dumps(up.served_model_name)
        self._public_field = b'"model":' + orjson.dumps(public)

    async def batches(self) -> AsyncIterator[StreamBatch]:
        try:
            async for block in read_blocks(self.response.content.iter_any()):
                yield self._batch(block)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self.failed(exc) from None

    def _batch(self, block: bytes) -> StreamBatch:
        n = block.count(b"\n\n")
        plain = (block.count(b"\n") == 2 * n and block.count(b"data: {") == n and block.count(b"}\n\n") == n
                 and block.count(self._served_field) == n and not any(mark in block for mark in SPECIAL))
        if not plain:
            events = self._events(block)  # now: an event that is not JSON fails here, before a byte is sent
            return StreamBatch(None, 0, lambda: events)
        # the field as vLLM writes it (no spaces) is a key, never inside a string, where quotes are escaped
        data = block.replace(self._served_field, self._public_field)
        return StreamBatch(data, content_events(block), lambda: self._events(block))

    def _events(self, block: bytes) -> list[StreamEvent]:
        return [item for item in map(self._parsed, split_block(block)) if item is not None]

    def _parsed(self, sse: SseEvent) -> StreamEvent | None:
        if sse.data.strip() == DONE:
            return StreamEvent(None, DONE)
        try:
            event = orjson.loads(sse.data)
        except orjson.JSONDecodeError:
            raise BadGateway(f"the LLM engine of {self.up.served_model_name} sent an event that is not JSON: "
                             f"{brief(sse.data.decode(errors='replace'))}") from None
        if not isinstance(event, dict):
            return None
        data = sse.data
        if event.get("model") == self.up.served_model_name:
            event["model"] = self.public
            data = (data.replace(self._served_field, self._public_field, 1) if self._served_field in data
                    else orjson.dumps(event))
        return StreamEvent(event, data)

    async def aclose(self) -> None:
        """A stream read to its end keeps its connection for the next call; one cut short closes it,
        and the engine aborts the generation."""
        self.done()
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()

    def __del__(self) -> None:  # a stream never read (its client left first) still frees its replica's count
        self.done()
