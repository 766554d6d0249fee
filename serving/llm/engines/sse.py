"""An engine's Server-Sent Events read as bytes, the events of one network read kept together.

Why not ``httpx``'s ``aiter_lines``: it splits with ``str.splitlines``, which also breaks a line at
U+2028, U+0085, U+001C-U+001E and the like, characters JSON leaves unescaped and a model may well
generate; a stream of a random-weight model broke there (an event's JSON cut in two). Server-Sent
Events end a line at CR, LF or CRLF only, and an event at an empty line; no other byte counts.

Why together: at a few thousand events a second (many streams, or ``n`` > 1) one ASGI message per
event costs the worker more than the events themselves; the events that arrived in one read are
passed on in one write, so nothing waits that had arrived (no buffering). :func:`read_blocks` keeps
them as the bytes they came in, so that a relay that has nothing to change in them parses nothing
(at a GPU's rate, tens of thousands of events a second, parsing each is most of a relay's cost).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import AsyncIterator

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_END = re.compile(rb"\r\n|\n|\r")
DONE = b"[DONE]"


@dataclass(frozen=True)
class SseEvent:
    data: bytes  # the event's data lines, joined with LF; an event without data is never yielded


def parse_block(block: bytes) -> SseEvent | None:
    """One event's lines: ``data:`` fields (one leading space dropped); comments and other fields ignored."""
    data = [line[6:] if line.startswith(b"data: ") else line[5:]
            for line in _LINE_END.split(block) if line.startswith(b"data:")]
    return SseEvent(b"\n".join(data)) if data else None


async def read_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[SseEvent]]:
    """The complete events of each chunk read, parsed (a part event waits for the rest of it)."""
    async for block in read_blocks(chunks):
        events = split_block(block)
        if events:
            yield events


async def read_blocks(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The complete events of each chunk read, as the bytes they came in, each ending with its blank
    line (``\\n\\n``); a part event waits for the rest of it. An engine that ends lines with CR gets its
    events written again with LF (JSON never holds a raw CR or LF, so every one is the stream's)."""
    pending = b""
    async for chunk in chunks:
        buffer = pending + chunk if pending else chunk
        if b"\r" in buffer:
            *blocks, pending = _EVENT_END.split(buffer)
            events = [event for event in map(parse_block, blocks) if event is not None]
            if events:
                yield b"".join(map(_written, events))
            continue
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            pending = buffer
            continue
        pending = buffer[cut + 2:]
        yield buffer[:cut + 2]
    tail = parse_block(pending) if pending.strip() else None
    if tail is not None:  # a last event without its blank line: the stream ended, the event is whole
        yield _written(tail)


def _written(event: SseEvent) -> bytes:
    """An event as LF-ended lines: one ``data:`` line per line of its data."""
    return b"".join(b"data: " + line + b"\n" for line in event.data.split(b"\n")) + b"\n"


def split_block(block: bytes) -> list[SseEvent]:
    """The events of a block :func:`read_blocks` gave."""
    return [event for event in map(parse_block, block.split(b"\n\n")) if event is not None]
