"""The ``embedding`` object of an encoder request's event (serving/worker/dataplane.py; preprocess/encoder.py
fills it), parsed leniently like ``llm``: a bad field is dropped, never the request's event::

    "embedding": {"task": "embed", "inputs": 32, "tokens": 417, "batches": [32]}

``inputs`` and ``tokens`` are the request's texts and their real tokens (what OpenAI's ``usage``
reports); ``batches`` are the sizes (texts) of the engine calls the token batcher formed with this
request's oldest text at their head: each call is reported by exactly one request, so a histogram of
them counts calls, not requests. Their metrics: serving/embeddings/metrics.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_BATCHES = 4096
TASKS = ("embed", "rerank")


@dataclass(frozen=True)
class EmbeddingCounts:
    task: str
    inputs: int
    tokens: int
    batches: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "inputs": self.inputs, "tokens": self.tokens, "batches": list(self.batches)}


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_embedding(value: Any) -> EmbeddingCounts | None:
    if not isinstance(value, dict):
        return None
    batches = value.get("batches")
    sizes = tuple(n for n in map(_count, batches[:MAX_BATCHES]) if n > 0) if isinstance(batches, list) else ()
    task = value.get("task") if value.get("task") in TASKS else "embed"
    return EmbeddingCounts(task=task, inputs=_count(value.get("inputs")), tokens=_count(value.get("tokens")),
                           batches=sizes)


