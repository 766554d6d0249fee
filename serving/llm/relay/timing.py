"""The ``llm`` field of a generation request's statistics event: time to first token, the gaps
between content chunks, end-to-end latency, token counts and finish reason (docs/llm-statistics.md).

Measured as the generation path relays the chunks (serving/llm/relay/generation.py): on a chunk it
parsed anyway, a few dict look-ups and one clock read; on a read it passes on unparsed, one clock read
for the content chunks counted in its bytes. The clock starts with the
request in the worker (``RequestStats.t0``), so TTFT includes routing, preprocess and the prompt
check as well as the engine's prefill. A non-streaming request has no first token the client sees
before the whole answer: its ``ttft_s`` is None (its end-to-end latency is ``e2e_s``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

MAX_GAPS = 512  # inter-token gaps kept per request: bounds the event's size for very long answers


@dataclass
class GenerationTimer:
    t0: float
    stream: bool
    first: float | None = None
    last: float | None = None
    gaps: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    def chunk(self, event: dict[str, Any]) -> None:
        """One parsed stream chunk: a chunk with content (chat ``delta.content`` or ``delta.tool_calls``,
        completions ``text``) is a token the client gets now."""
        choices = event.get("choices")
        if not choices:
            return
        choice = choices[0]
        if self.finish_reason is None and choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta")
        if delta.get("content") or delta.get("tool_calls") if isinstance(delta, dict) else choice.get("text"):
            self.tokens(1)

    def tokens(self, count: int) -> None:
        """``count`` content chunks that arrived together and are passed on now (a read the relay passes on
        as its bytes, its content counted without parsing it): the first gap from the last, then none."""
        if count <= 0:
            return
        now = time.perf_counter()
        if self.last is None:
            self.first = now
        elif len(self.gaps) < MAX_GAPS:
            self.gaps.append(now - self.last)
        self.gaps.extend([0.0] * min(count - 1, MAX_GAPS - len(self.gaps)))
        self.last = now

    def answered(self, answer: Any) -> None:
        """A non-streaming answer: its first choice's finish reason."""
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
            self.finish_reason = str(choices[0]["finish_reason"])

    def event(self, usage: dict[str, int] | None) -> dict[str, Any]:
        """The event's ``llm`` object, at the end of the request."""
        usage = usage or {}
        return {"ttft_s": None if self.first is None else self.first - self.t0, "itl_s": self.gaps,
                "e2e_s": time.perf_counter() - self.t0, "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": int(usage.get("completion_tokens") or 0),
                "finish_reason": self.finish_reason, "stream": self.stream}
