"""Generation statistics of LLM endpoints, from the ``llm`` object of their requests' events
(names and meaning in docs/llm-statistics.md).

Labels are the endpoint and the model version that answered (as ``serving_requests_total``), and for
finish reasons a bounded reason (serving/statistics/llm_events.py). The per-request token histograms
are ``..._tokens_per_request``: a counter and a histogram cannot share the family name
``serving_llm_prompt_tokens`` in one exposition. Histograms only, never summaries,
so replicas sum and quantiles come from PromQL. A shadow copy's event never reaches here (its own
series: serving/statistics/metrics.py), so these are what clients got.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from serving.statistics.events import StatisticsEvent
from serving.statistics.metrics import LATENCY_BUCKETS, version_label

TTFT_BUCKETS = LATENCY_BUCKETS
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (*LATENCY_BUCKETS, 60.0, 120.0)
TOKEN_BUCKETS = tuple(float(1 << i) for i in range(16))  # 1 .. 32768


class LlmMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["endpoint", "version"]
        self.ttft = Histogram("serving_llm_time_to_first_token_seconds",
                              "Time from the request's arrival in the worker to the first content chunk sent "
                              "to the client (streaming requests only).", labels, buckets=TTFT_BUCKETS,
                              registry=registry)
        self.itl = Histogram("serving_llm_inter_token_latency_seconds",
                             "Gaps between consecutive content chunks of a stream (one observation per gap).",
                             labels, buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("serving_llm_e2e_latency_seconds", "Generation request latency in the worker, "
                             "to the last chunk of a stream.", labels, buckets=E2E_BUCKETS, registry=registry)
        self.prompt_total = Counter("serving_llm_prompt_tokens", "Prompt tokens (the engine's usage).", labels,
                                    registry=registry)
        self.completion_total = Counter("serving_llm_completion_tokens", "Completion tokens (the engine's usage).",
                                        labels, registry=registry)
        self.prompt = Histogram("serving_llm_prompt_tokens_per_request", "Prompt tokens per request.",
                                labels, buckets=TOKEN_BUCKETS, registry=registry)
        self.completion = Histogram("serving_llm_completion_tokens_per_request", "Completion tokens per request.",
                                    labels, buckets=TOKEN_BUCKETS, registry=registry)
        self.finish = Counter("serving_llm_finish_reason", "Generation requests by the first choice's finish "
                              "reason (none: the stream ended without one).", [*labels, "reason"],
                              registry=registry)
        self._children: dict[tuple[str, int | None], tuple[Any, ...]] = {}

    def observe(self, event: StatisticsEvent) -> None:
        llm = event.llm
        if llm is None:
            return
        key = (event.endpoint, event.version)
        children = self._children.get(key)
        if children is None:
            labels = (event.endpoint, version_label(event.version))
            children = self._children[key] = tuple(m.labels(*labels) for m in (
                self.ttft, self.itl, self.e2e, self.prompt_total, self.completion_total, self.prompt,
                self.completion))
        ttft, itl, e2e, prompt_total, completion_total, prompt, completion = children
        if llm.ttft_s is not None:
            ttft.observe(llm.ttft_s)
        for gap in llm.itl_s:
            itl.observe(gap)
        if llm.e2e_s is not None:
            e2e.observe(llm.e2e_s)
        prompt_total.inc(llm.prompt_tokens)
        completion_total.inc(llm.completion_tokens)
        prompt.observe(llm.prompt_tokens)
        completion.observe(llm.completion_tokens)
        self.finish.labels(event.endpoint, version_label(event.version), llm.finish_reason).inc()
