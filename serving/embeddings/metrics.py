"""Prometheus metrics of encoder endpoints (embeddings, rerank) from their events' ``embedding`` object
(serving/embeddings/events.py): tokens and texts per request, texts per engine call. Labels
are the endpoint and the version that answered; names and meaning in docs/embeddings.md.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from serving.embeddings.events import EmbeddingCounts
from serving.statistics.metrics import version_label

COUNT_BUCKETS = tuple(float(1 << i) for i in range(13))  # 1 .. 4096
TOKEN_BUCKETS = tuple(float(1 << i) for i in range(3, 20))  # 8 .. 524288


class EmbeddingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["endpoint", "version"]
        self.tokens_total = Counter("serving_embedding_tokens", "Tokens of the texts encoder endpoints answered "
                                    "(OpenAI's usage.prompt_tokens).", labels, registry=registry)
        self.tokens = Histogram("serving_embedding_tokens_per_request", "Tokens per encoder request.", labels,
                                buckets=TOKEN_BUCKETS, registry=registry)
        self.inputs = Histogram("serving_embedding_inputs_per_request", "Texts (or pairs) per encoder request.",
                                labels, buckets=COUNT_BUCKETS, registry=registry)
        self.batch = Histogram("serving_embedding_batch_size", "Texts in each engine call the token batcher "
                               "formed (rows of many requests share a call).", labels, buckets=COUNT_BUCKETS,
                               registry=registry)

    def observe(self, endpoint: str, version: int | None, counts: EmbeddingCounts | None) -> None:
        if counts is None:
            return
        labels = (endpoint, version_label(version))
        self.tokens_total.labels(*labels).inc(counts.tokens)
        self.tokens.labels(*labels).observe(counts.tokens)
        self.inputs.labels(*labels).observe(counts.inputs)
        batch = self.batch.labels(*labels)
        for size in counts.batches:
            batch.observe(size)
