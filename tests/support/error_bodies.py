"""Error bodies as a front end shapes them, less the ids every worker error body carries
(serving/worker/tracing_layer.py): the request id, which must be the answer's X-Request-Id, and the trace
id when tracing is on."""
from __future__ import annotations

from typing import Any


def without_ids(answer: Any, ours: bool = True) -> dict:
    """``ours`` False: the answer may be another server's (real TorchServe's), which names no request."""
    body = dict(answer.json())
    if ours or "request_id" in body:
        assert body.pop("request_id", None) == answer.headers["X-Request-Id"], body
    body.pop("trace_id", None)
    return body
