"""The ``llm`` object of a generation request's event (serving/llm/relay/timing.py), parsed leniently:
a bad field is dropped, never the request's event (its request counts and latency still count)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "abort", "error")
OTHER_REASON, NO_REASON = "other", "none"  # an unknown reason (bounded labels); a stream that never finished
MAX_GAPS = 512


@dataclass(frozen=True)
class LlmTiming:
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str      # one of FINISH_REASONS, OTHER_REASON or NO_REASON
    stream: bool

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_s": self.ttft_s, "itl_s": list(self.itl_s), "e2e_s": self.e2e_s,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "finish_reason": self.finish_reason, "stream": self.stream}


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_llm(value: Any) -> LlmTiming | None:
    if not isinstance(value, dict):
        return None
    gaps = value.get("itl_s")
    itl = tuple(g for g in map(_seconds, gaps[:MAX_GAPS]) if g is not None) if isinstance(gaps, list) else ()
    reason = value.get("finish_reason")
    reason = NO_REASON if reason is None else reason if reason in FINISH_REASONS else OTHER_REASON
    return LlmTiming(ttft_s=_seconds(value.get("ttft_s")), itl_s=itl, e2e_s=_seconds(value.get("e2e_s")),
                     prompt_tokens=_count(value.get("prompt_tokens")),
                     completion_tokens=_count(value.get("completion_tokens")),
                     finish_reason=reason, stream=bool(value.get("stream")))
