"""Prometheus metrics for requests and declared variables (names in docs/statistics.md).

Requests and latencies use prometheus-client's own Counter/Histogram. Declared
variables use a custom collector instead, because each variable has its own
buckets (or values) and they must still share one metric family per kind: a
dashboard can then template over the ``variable`` label, instead of needing one
metric name per variable. Everything aggregatable is a histogram, never a summary,
so replicas can be summed and quantiles taken in PromQL.
"""
from __future__ import annotations

import math
import threading
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from serving.statistics.definitions import VariableDef
from serving.statistics.events import STAGES, StatisticsEvent

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OTHER = "other"  # enum label for values outside the declared ones (bounds cardinality)
VarKey = tuple[str, str, str]  # endpoint, version label, variable


def version_label(version: int | None) -> str:
    return "none" if version is None else str(version)


class RequestMetrics:
    """Request counter and latency histograms, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("serving_requests", "Requests served, by endpoint, model version and HTTP status.",
                                ["endpoint", "version", "status"], registry=registry)
        self.latency = Histogram("serving_request_latency_seconds", "End-to-end request latency in the worker.",
                                 ["endpoint", "version"], buckets=LATENCY_BUCKETS, registry=registry)
        self.stage_latency = Histogram("serving_stage_latency_seconds",
                                       "Latency of one stage (preprocess, inference, postprocess).",
                                       ["endpoint", "version", "stage"], buckets=LATENCY_BUCKETS, registry=registry)

        # labelled children by (endpoint, version, status): ``labels()`` was a quarter of
        # the ingestion time, and the label sets are few and long-lived
        self._children: dict[tuple[str, int | None, int], tuple[Any, Any, dict[str, Any]]] = {}

    def observe(self, event: StatisticsEvent) -> None:
        key = (event.endpoint, event.version, event.status)
        children = self._children.get(key)
        if children is None:
            version = version_label(event.version)
            children = self._children[key] = (
                self.requests.labels(event.endpoint, version, str(event.status)),
                self.latency.labels(event.endpoint, version),
                {stage: self.stage_latency.labels(event.endpoint, version, stage) for stage in STAGES})
        requests, latency, stages = children
        requests.inc()
        latency.observe(event.latency_s)
        for stage, seconds in event.stages.items():
            stages[stage].observe(seconds)


AGREEMENT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
COSINE_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)
MAD_BUCKETS = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ShadowMetrics:
    """Copies served by shadow versions: their own series, never in the live request series
    (so error rates and the canary share stay those of what clients got)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["endpoint", "version"]
        self.requests = Counter("serving_shadow_requests", "Copies of requests served by a shadow version, by status.",
                                [*labels, "status"], registry=registry)
        self.latency = Histogram("serving_shadow_latency_seconds", "Latency of a shadow copy in the worker.",
                                 labels, buckets=LATENCY_BUCKETS, registry=registry)
        self.agreement = Counter("serving_shadow_label_agreement",
                                 "Shadow answers compared with the live answer: agree=true|false (same label).",
                                 [*labels, "agree"], registry=registry)
        self.mad = Histogram("serving_shadow_logit_mad",
                             "Mean absolute difference of the shadow's logits (or numbers) from the live answer's.",
                             labels, buckets=MAD_BUCKETS, registry=registry)
        self.dropped = Counter("serving_shadow_dropped", "Copies a worker dropped because the shadow was too slow.",
                               labels, registry=registry)
        self.llm_agreement = Histogram("serving_llm_shadow_agreement",
                                       "LLM shadow copies: 1 when the text equals the live answer's (greedy requests), "
                                       "else the whitespace-token F1 of the two texts (docs/llm-rollouts.md).",
                                       labels, buckets=AGREEMENT_BUCKETS, registry=registry)
        self.cosine = Histogram("serving_shadow_embedding_cosine",
                                "Embedding shadow copies: the lowest cosine similarity of a copy's vectors to the live "
                                "answer's (docs/embeddings.md).", labels, buckets=COSINE_BUCKETS, registry=registry)
        self._compared: set[tuple[str, str]] = set()

    def observe(self, event: StatisticsEvent) -> None:
        shadow = event.shadow
        labels = (event.endpoint, version_label(event.version))
        if shadow is None:
            return
        if shadow.dropped:
            self.dropped.labels(*labels).inc()
            return
        self.requests.labels(*labels, str(event.status)).inc()
        self.latency.labels(*labels).observe(event.latency_s)
        if shadow.agree is not None:
            if labels not in self._compared:  # both series exist from the first comparison: rates never vanish
                self._compared.add(labels)
                self.agreement.labels(*labels, "true" if not shadow.agree else "false")
            self.agreement.labels(*labels, "true" if shadow.agree else "false").inc()
        if shadow.mad is not None:
            self.mad.labels(*labels).observe(shadow.mad)
        if shadow.agreement is not None:
            self.llm_agreement.labels(*labels).observe(shadow.agreement)
        if shadow.cosine is not None:
            self.cosine.labels(*labels).observe(shadow.cosine)


@dataclass
class _Scalar:
    buckets: tuple[float, ...]
    counts: list[int]  # per bucket, not cumulative; last is +Inf
    total: float = 0.0


@dataclass
class _Series:
    definition: VariableDef
    scalar: _Scalar | None = None
    enum: dict[str, int] = field(default_factory=dict)
    value: float | None = None


def as_number(raw: Any) -> float | None:
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class VariableMetrics:
    """Custom collector for declared variables: scalar histograms, enum counters, value gauges."""

    def __init__(self) -> None:
        self._series: dict[VarKey, _Series] = {}
        self._lock = threading.Lock()

    def observe(self, key: VarKey, definition: VariableDef, raw: Any) -> None:
        with self._lock:
            series = self._series.get(key)
            if series is None or series.definition != definition:  # new or redefined: start afresh
                series = self._series[key] = self._new(definition)
            self._observe(series, raw)

    def retain(self, keep: Callable[[VarKey], bool]) -> None:
        """Stop exporting series the config no longer has (removed variable, version or endpoint)."""
        with self._lock:
            self._series = {k: s for k, s in self._series.items() if keep(k)}

    @staticmethod
    def _new(definition: VariableDef) -> _Series:
        if definition.kind == "scalar":
            return _Series(definition, scalar=_Scalar(definition.buckets, [0] * (len(definition.buckets) + 1)))
        if definition.kind == "enum":
            return _Series(definition, enum={v: 0 for v in (*definition.values, OTHER)})
        return _Series(definition)

    @staticmethod
    def _observe(series: _Series, raw: Any) -> None:
        kind = series.definition.kind
        if kind == "enum":
            value = str(raw)
            series.enum[value if value in series.enum else OTHER] += 1
            return
        number = as_number(raw)
        if number is None:
            return
        if kind == "value":
            series.value = number
        elif series.scalar is not None:
            s = series.scalar
            s.counts[bisect_left(s.buckets, number)] += 1  # le semantics: value <= bound
            s.total += number

    def collect(self) -> Iterator[Metric]:
        labels = ["endpoint", "version", "variable"]
        scalar = HistogramMetricFamily("serving_variable_scalar", "Declared scalar variables, with their buckets.",
                                       labels=labels)
        enum = CounterMetricFamily("serving_variable_enum", "Declared enum variables, by value.",
                                   labels=[*labels, "value"])
        gauge = GaugeMetricFamily("serving_variable_value", "Declared value variables: the last value seen.",
                                  labels=labels)
        with self._lock:
            for key, series in self._series.items():
                self._emit(key, series, scalar, enum, gauge)
        yield from (scalar, enum, gauge)

    @staticmethod
    def _emit(key: VarKey, series: _Series, scalar: HistogramMetricFamily, enum: CounterMetricFamily,
              gauge: GaugeMetricFamily) -> None:
        if series.scalar is not None:
            s, running, buckets = series.scalar, 0, []
            for bound, count in zip((*s.buckets, math.inf), s.counts):
                running += count
                buckets.append((floatToGoString(bound), running))
            scalar.add_metric(list(key), buckets, s.total)
        for value, count in series.enum.items():
            enum.add_metric([*key, value], count)
        if series.value is not None:
            gauge.add_metric(list(key), series.value)
