"""Datasets out of the prediction log (``serving log export``): one row per request, feedback joined.

Two passes over the source, streamed: the first keeps only the feedback (request id -> the true label
or value: small), the second writes each selected request's row as it reads it. A record the Kafka sink
delivered twice (at least once) is written once: a row is kept per request id and ``shadow``.

Rows have one flat schema in every format, so pandas and Hugging Face ``datasets`` open the file as it
is: ``inputs`` and ``outputs`` are JSON text (their shapes differ between endpoints, and even between
requests when one was summarized); the rest are scalars. ``openai-chat`` writes OpenAI's fine-tuning
format instead, ``{"messages": [..., {"role": "assistant", "content": ...}]}`` per live 200 answer of an
LLM endpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import orjson

COLUMNS = ("request_id", "ts", "endpoint", "version", "status", "latency_s", "shadow", "client", "error",
           "inputs", "outputs", "prompt_tokens", "completion_tokens", "feedback_label", "feedback_value")
FORMATS = ("parquet", "jsonl", "openai-chat")
Source = Callable[[], Iterable[dict[str, Any]]]  # a fresh pass over the records


@dataclass(frozen=True)
class Selection:
    endpoint: str
    since: float | None = None   # Unix seconds; records before are left out
    until: float | None = None
    version: int | None = None
    shadow: bool = False         # also the shadow copies' records (a "shadow" column tells them apart)

    def takes(self, record: dict[str, Any]) -> bool:
        if record.get("kind") is not None or record.get("endpoint") != self.endpoint:
            return False
        if record.get("shadow") and not self.shadow:
            return False
        ts = record.get("ts") or 0.0
        if (self.since is not None and ts < self.since) or (self.until is not None and ts >= self.until):
            return False
        return self.version is None or record.get("version") == self.version


def feedback_of(records: Iterable[dict[str, Any]], endpoint: str) -> dict[str, dict[str, Any]]:
    return {r["request_id"]: r for r in records
            if r.get("kind") == "feedback" and r.get("endpoint") == endpoint and r.get("request_id")}


def _text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def rows(source: Source, selection: Selection, with_feedback: bool = False) -> Iterator[dict[str, Any]]:
    feedback = feedback_of(source(), selection.endpoint) if with_feedback else {}
    seen: set[tuple[str, bool]] = set()
    for record in source():
        if not selection.takes(record):
            continue
        key = (record.get("request_id") or "", bool(record.get("shadow")))
        if key[0] and key in seen:
            continue
        seen.add(key)
        usage = record.get("usage") or {}
        label = (feedback.get(key[0]) or {}).get("label")
        yield {"request_id": record.get("request_id"), "ts": record.get("ts"), "endpoint": record.get("endpoint"),
               "version": record.get("version"), "status": record.get("status"), "latency_s": record.get("latency_s"),
               "shadow": bool(record.get("shadow")), "client": record.get("client"), "error": record.get("error"),
               "inputs": _text(record.get("inputs")), "outputs": _text(record.get("outputs")),
               "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
               "feedback_label": None if label is None else str(label),
               "feedback_value": (feedback.get(key[0]) or {}).get("value")}


def chat_example(row: dict[str, Any]) -> dict[str, Any] | None:
    """A live 200 answer of an LLM endpoint in OpenAI's fine-tuning chat format, or None."""
    if row["shadow"] or row["status"] != 200 or row["inputs"] is None or row["outputs"] is None:
        return None
    inputs, outputs = orjson.loads(row["inputs"]), orjson.loads(row["outputs"])
    choices = outputs.get("choices") if isinstance(outputs, dict) else None
    if not isinstance(inputs, dict) or not choices:
        return None
    messages = inputs.get("messages")
    if not isinstance(messages, list):
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str):
            return None
        messages = [{"role": "user", "content": prompt}]
    return {"messages": [*messages, {"role": "assistant", "content": choices[0].get("text") or ""}]}


def write(rows_: Iterable[dict[str, Any]], path: Path, fmt: str) -> int:
    """Write the rows in ``fmt`` to ``path``; the rows written."""
    if fmt == "parquet":
        return _parquet(rows_, path)
    n = 0
    with open(path, "wb") as f:
        for row in rows_:
            item = chat_example(row) if fmt == "openai-chat" else row
            if item is not None:
                f.write(orjson.dumps(item) + b"\n")
                n += 1
    return n


def _parquet(rows_: Iterable[dict[str, Any]], path: Path, group: int = 10_000) -> int:
    """Row groups of ``group`` rows, written as they fill: memory holds one group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("request_id", pa.string()), ("ts", pa.float64()), ("endpoint", pa.string()),
                        ("version", pa.int64()), ("status", pa.int64()), ("latency_s", pa.float64()),
                        ("shadow", pa.bool_()), ("client", pa.string()), ("error", pa.string()),
                        ("inputs", pa.string()), ("outputs", pa.string()), ("prompt_tokens", pa.int64()),
                        ("completion_tokens", pa.int64()), ("feedback_label", pa.string()),
                        ("feedback_value", pa.float64())])
    n, batch = 0, []
    with pq.ParquetWriter(str(path), schema) as writer:
        for row in rows_:
            batch.append(row)
            if len(batch) == group:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n, batch = n + len(batch), []
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n + len(batch)
