"""One prediction-log record from a finished request.

A record is a flat JSON object: the request's identity (``request_id``, ``ts``, ``endpoint``,
``version``, ``status``, ``latency_s``, ``shadow``) and, as the endpoint's fields say, its ``inputs`` as
the client sent them, its ``outputs``, its ``error``, the client key's name (``client``: never the key)
and, for an LLM, the token ``usage``. Tensors become ``{"dtype", "shape", "data"}``; bytes that are
not text become base64. Inputs or outputs whose JSON passes the policy's byte cap are summarized
(size, SHA-256, and a preview or a tensor's min, max and mean) rather than cut mid-value: a summary is
valid JSON that says what it stands for. Redaction runs on every string before the cap, so a preview
never shows what a pattern hides.
"""
from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from serving.prediction_log.policy import LogPolicy

PREVIEW_CHARS = 512


@dataclass
class Captured:
    """A request the prediction log keeps, under its endpoint's policy: what its path hands over as it
    goes (the data plane, the LLM relay)."""

    policy: LogPolicy
    inputs: Any = None
    outputs: Any = None
    usage: dict | None = None


def _array(value: np.ndarray, policy: LogPolicy) -> dict[str, Any]:
    head = {"dtype": str(value.dtype), "shape": list(value.shape)}
    if value.nbytes > policy.max_bytes:
        out = {**head, "summarized": True, "bytes": int(value.nbytes),
               "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
        if value.size and np.issubdtype(value.dtype, np.number):
            out |= {"min": float(value.min()), "max": float(value.max()), "mean": float(value.mean())}
        return out
    if value.dtype.kind in "OSU":
        return {**head, "data": jsonable(value.tolist(), policy)}
    return {**head, "data": value.tolist()}


def jsonable(value: Any, policy: LogPolicy) -> Any:
    """``value`` as JSON can hold it, every string redacted."""
    if isinstance(value, str):
        return policy.scrub(value)
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return _array(value, policy)
    if isinstance(value, np.generic):
        return jsonable(value.item(), policy)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return policy.scrub(data.decode("utf-8"))
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): jsonable(v, policy) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, policy) for v in value]
    return policy.scrub(str(value))


def capped(value: Any, policy: LogPolicy) -> Any:
    """A JSON value within the policy's byte cap: itself, or its summary."""
    data = orjson.dumps(value)
    if len(data) <= policy.max_bytes:
        return value
    return {"summarized": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "preview": data[:PREVIEW_CHARS].decode("utf-8", errors="replace")}


def build(captured: Captured, *, request_id: str | None, endpoint: str, version: int | None, status: int,
          latency_s: float, error: str | None = None, client: str | None = None,
          shadow: bool = False, ts: float | None = None, trace_id: str | None = None) -> dict[str, Any]:
    policy = captured.policy
    record: dict[str, Any] = {"request_id": request_id, "ts": time.time() if ts is None else ts,
                              "endpoint": endpoint, "version": version, "status": status,
                              "latency_s": round(latency_s, 6), "shadow": shadow}
    if trace_id:
        record["trace_id"] = trace_id
    fields = policy.fields
    if "inputs" in fields:
        record["inputs"] = capped(jsonable(captured.inputs, policy), policy)
    if "outputs" in fields and captured.outputs is not None:
        record["outputs"] = capped(jsonable(captured.outputs, policy), policy)
    if "error" in fields and error:
        record["error"] = policy.scrub(error)
    if "client" in fields and client:
        record["client"] = client
    if "usage" in fields and captured.usage:
        record["usage"] = captured.usage
    return record
