"""TorchServe's metric names, beside the platform's, for endpoints that serve TorchServe archives.

A TorchServe user's dashboards read ``ts_inference_requests_total``, ``ts_inference_latency_microseconds``
and ``ts_queue_latency_microseconds`` (labels ``model_name``, ``model_version``, ``hostname``): the
same names and labels here, from each request's event (serving/statistics/torchserve_events.py).
``model_name`` is the endpoint, ``model_version`` the version that answered. The two latency series
are running totals in microseconds, as TorchServe's are, exposed under their exact names.

Custom metrics a handler adds through ``context.metrics`` are exposed under the handler's own
names, labelled with its dimensions (``ModelName``, ``Level``, its own) plus ``endpoint`` and
``version``: a counter adds up, a gauge keeps its last value, a histogram exposes ``_sum`` and
``_count``. Series are bounded per name, and a name that would shadow one of the platform's own
series is prefixed ``handler_``.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily

from serving.statistics.metrics import version_label
from serving.statistics.torchserve_events import HandlerMetric, TorchServeTiming

LABELS = ["model_name", "model_version", "hostname"]
MAX_NAMES = 200  # distinct custom metric names kept
MAX_SERIES = 1000  # label sets kept per name
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(name: str) -> str:
    safe = _UNSAFE.sub("_", name)
    safe = safe if safe and not safe[0].isdigit() else f"_{safe}"
    return f"handler_{safe}" if safe.startswith(("serving_", "ts_", "handler_")) else safe


class _Totals:
    """A running total per label set, exposed under an exact name (no ``_total`` suffix added)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, labels: tuple[str, ...], value: float) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + value

    def family(self) -> Metric:
        family = UnknownMetricFamily(self.name, self.documentation, labels=LABELS)
        for labels, value in self.values.items():
            family.add_metric(list(labels), value)
        return family


class TorchServeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("ts_inference_requests", "Requests to TorchServe archives' endpoints (TorchServe's "
                                "name).", LABELS, registry=registry)
        self.latency = _Totals("ts_inference_latency_microseconds", "Total time requests took, microseconds.")
        self.queue = _Totals("ts_queue_latency_microseconds", "Total time requests waited for their batch, "
                             "microseconds.")
        self.custom: dict[tuple[str, str], _Custom] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, endpoint: str, version: int | None, latency_s: float, timing: TorchServeTiming | None) -> None:
        if timing is None:
            return
        labels = (endpoint, version_label(version), timing.hostname)
        self.requests.labels(*labels).inc()
        with self._lock:
            self.latency.add(labels, latency_s * 1e6)
            self.queue.add(labels, timing.queue_s * 1e6)
            for metric in timing.metrics:
                self._custom(endpoint, version, metric)

    def _custom(self, endpoint: str, version: int | None, metric: HandlerMetric) -> None:
        """One series per label set; a name keeps the label names it was first seen with (one family
        per name), so a later value with other dimensions is left out rather than break the scrape."""
        key = (prometheus_name(metric.name), metric.kind)
        names = (*(prometheus_name(k).removeprefix("handler_") for k, _ in metric.dimensions), "endpoint", "version")
        entry = self.custom.get(key)
        if entry is None:
            if len(self.custom) >= MAX_NAMES:
                return
            entry = self.custom[key] = _Custom(names)
        values = (*(v for _, v in metric.dimensions), endpoint, version_label(version))
        if names != entry.names or (values not in entry.series and len(entry.series) >= MAX_SERIES):
            return
        if metric.kind == "GAUGE":
            entry.series[values] = metric.value
        elif metric.kind == "HISTOGRAM":
            total, count = entry.series.get(values, (0.0, 0))
            entry.series[values] = (total + metric.value, count + 1)
        else:
            entry.series[values] = entry.series.get(values, 0.0) + metric.value

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield self.latency.family()
            yield self.queue.family()
            for (name, kind), entry in self.custom.items():
                yield from entry.families(name, kind)

    def describe(self) -> list[Metric]:
        return []  # unknown until handlers report: collected at each scrape


@dataclass
class _Custom:
    names: tuple[str, ...]
    series: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def families(self, name: str, kind: str) -> Iterator[Metric]:
        labels = list(self.names)
        if kind == "HISTOGRAM":
            total = UnknownMetricFamily(f"{name}_sum", "Sum of a handler's histogram values.", labels=labels)
            count = UnknownMetricFamily(f"{name}_count", "Count of a handler's histogram values.", labels=labels)
            for values, (s, n) in self.series.items():
                total.add_metric(list(values), s)
                count.add_metric(list(values), n)
            yield from (total, count)
            return
        family = (GaugeMetricFamily if kind == "GAUGE" else UnknownMetricFamily)(
            name, f"A handler's {kind.lower()} (context.metrics).", labels=labels)
        for values, value in self.series.items():
            family.add_metric(list(values), value)
        yield family
