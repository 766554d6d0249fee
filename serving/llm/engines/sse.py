"""An engine's Server-Sent Events read as bytes, the events of one network read kept together.

Why not ``httpx``'s ``aiter_lines``: it splits with ``str.splitlines``, which also breaks a line at
U+2028, U+0085, U+001C-U+001E and the like, characters JSON leaves unescaped and a model may well
generate; a stream of a random-weight model broke there (an event's JSON cut in two). Server-Sent
Events end a line at CR, LF or CRLF only, and an event at an empty line; no other byte counts.

Why together: at a few thousand events a second (many streams, or ``n`` > 1) one ASGI message per
event costs the worker more than the events themselves; the events that arrived in one read are
passed on in one write, so nothing waits that had arrived (no buffering).
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
    """The complete events of each chunk read (a part event waits for the rest of it)."""
    pending = b""
    async for chunk in chunks:
        *blocks, pending = _EVENT_END.split(pending + chunk)
        events = [event for event in map(parse_block, blocks) if event is not None]
        if events:
            yield events
    tail = parse_block(pending) if pending.strip() else None
    if tail is not None:  # a last event without its empty line: the stream ended, the event is whole
        yield [tail]
