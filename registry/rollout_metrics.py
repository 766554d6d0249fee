"""What a rollout gate reads: one version's requests, errors, p99 latency and drift over a window,
and for LLM endpoints the p99 of time to first token and of inter-token latency.

Two sources, same answer: the statistics service's own ``/metrics`` (the default: no
Prometheus needed), read at the start and the end of each step and differenced; or a
Prometheus that scrapes it (``SERVING_PROMETHEUS_URL``), asked with PromQL over the
step's window. Latency quantiles come from the histogram buckets the same way
Prometheus' ``histogram_quantile`` computes them.

The LLM figures come from the statistics service's generation histograms (docs/llm-statistics.md):
``serving_llm_time_to_first_token_seconds`` and ``serving_llm_inter_token_latency_seconds``; a
version without them (an encoder, or no stream yet) has None, and its gates are not judged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Window:
    """One version's figures over a rollout step."""

    requests: float
    errors: float  # responses that were not 2xx
    p99_s: float | None  # None without requests
    drift: float | None  # the largest PSI of the version's variables, None when none is measured
    ttft_p99_s: float | None = None  # LLM endpoints: time to first token, p99 (None without observations)
    itl_p99_s: float | None = None   # LLM endpoints: inter-token latency (gaps between chunks), p99

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass
class Counters:
    """Cumulative counters of one version at one moment."""

    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    drift: float | None = None
    llm: dict[str, dict[float, float]] = field(default_factory=dict)  # LLM_HISTOGRAMS name -> its buckets


# the LLM histograms a gate reads (owned by the statistics service): Window field -> metric family
LLM_HISTOGRAMS = {"ttft_p99_s": "serving_llm_time_to_first_token_seconds",
                  "itl_p99_s": "serving_llm_inter_token_latency_seconds"}


def _difference(end: dict[float, float], start: dict[float, float]) -> dict[float, float]:
    return {le: end[le] - start.get(le, 0.0) for le in end}


@dataclass(frozen=True)
class Quality:
    """A version's live quality from ground truth (serving/statistics/ground_truth.py): over the statistics
    service's live window, the requests given their true label, and the share predicted right."""

    labelled: float
    accuracy: float | None  # None without a labelled request


class MetricsSource(Protocol):
    def snapshot(self, endpoint: str, version: int) -> Counters | None: ...

    def window(self, endpoint: str, version: int, start: Counters | None, seconds: float) -> Window: ...

    def quality(self, endpoint: str, version: int) -> Quality: ...


QUALITY = {"serving_live_labelled": "labelled", "serving_live_accuracy": "accuracy"}


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """``histogram_quantile``: linear interpolation inside the bucket holding the q-th observation."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    rank = q * buckets[edges[-1]]
    lower_edge, lower_count = 0.0, 0.0
    for le in edges:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower_edge
            if count == lower_count:
                return le
            return lower_edge + (le - lower_edge) * (rank - lower_count) / (count - lower_count)
        lower_edge, lower_count = le, count
    return edges[-1]


_LLM_FAMILIES = frozenset(LLM_HISTOGRAMS.values())


class StatisticsServiceSource:
    """Scrapes the statistics service's ``/metrics`` and differences two scrapes."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.timeout_s = timeout_s

    def snapshot(self, endpoint: str, version: int) -> Counters | None:
        try:
            text = httpx.get(self.url, timeout=self.timeout_s).text
        except httpx.HTTPError:
            return None
        out, v = Counters(), str(version)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("endpoint") != endpoint or s.labels.get("version") != v:
                    continue
                if s.name == "serving_requests_total":
                    out.requests += s.value
                    if not s.labels.get("status", "").startswith("2"):
                        out.errors += s.value
                elif s.name == "serving_request_latency_seconds_bucket":
                    le = float(s.labels["le"])
                    out.buckets[le] = out.buckets.get(le, 0.0) + s.value
                elif s.name == "serving_drift_psi" and not math.isnan(s.value):
                    out.drift = max(out.drift or 0.0, s.value)
                elif s.name.endswith("_bucket") and s.name[:-len("_bucket")] in _LLM_FAMILIES:
                    buckets = out.llm.setdefault(s.name[:-len("_bucket")], {})
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
        return out

    def quality(self, endpoint: str, version: int) -> Quality:
        try:
            text = httpx.get(self.url, timeout=self.timeout_s).text
        except httpx.HTTPError as exc:
            raise ConnectionError(f"the statistics service at {self.url} did not answer: {exc}") from exc
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in QUALITY and s.labels.get("endpoint") == endpoint and s.labels.get("version") == str(version):
                    found[QUALITY[s.name]] = s.value
        return Quality(found.get("labelled", 0.0), found.get("accuracy"))

    def window(self, endpoint: str, version: int, start: Counters | None, seconds: float) -> Window:
        end = self.snapshot(endpoint, version)
        if end is None:
            raise ConnectionError(f"the statistics service at {self.url} did not answer")
        start = start or Counters()
        llm = {name: quantile(0.99, _difference(end.llm.get(metric, {}), start.llm.get(metric, {})))
               for name, metric in LLM_HISTOGRAMS.items()}
        return Window(requests=end.requests - start.requests, errors=end.errors - start.errors,
                      p99_s=quantile(0.99, _difference(end.buckets, start.buckets)), drift=end.drift, **llm)


class PrometheusSource:
    """PromQL over the step's window against a Prometheus that scrapes the statistics service."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/api/v1/query"
        self.timeout_s = timeout_s

    def _scalar(self, query: str) -> float | None:
        r = httpx.get(self.url, params={"query": query}, timeout=self.timeout_s)
        r.raise_for_status()
        result = r.json()["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    def snapshot(self, endpoint: str, version: int) -> Counters | None:
        return None  # PromQL reads the window itself

    def quality(self, endpoint: str, version: int) -> Quality:
        sel = f'endpoint="{endpoint}",version="{version}"'
        try:
            return Quality(self._scalar(f"sum(serving_live_labelled{{{sel}}})") or 0.0,
                           self._scalar(f"max(serving_live_accuracy{{{sel}}})"))
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ConnectionError(f"Prometheus at {self.url} could not answer: {exc}") from exc

    @staticmethod
    def _since(aggregate: str, selector: str, window: str) -> str:
        """Growth over the window. Not ``increase()``: a candidate's series is born inside its first
        step, and ``increase`` misses a series' first samples; a series absent at the window's
        start counts from zero."""
        now, then = f"{aggregate}({selector})", f"{aggregate}({selector} offset {window})"
        return f"({now} - {then}) or {now}"

    def window(self, endpoint: str, version: int, start: Counters | None, seconds: float) -> Window:
        sel = f'endpoint="{endpoint}",version="{version}"'
        w = f"{max(1, int(round(seconds)))}s"
        try:
            requests = self._scalar(self._since("sum", f"serving_requests_total{{{sel}}}", w)) or 0.0
            errors = self._scalar(self._since("sum", f'serving_requests_total{{{sel},status!~"2.."}}', w)) or 0.0
            buckets = self._since("sum by (le) ", f"serving_request_latency_seconds_bucket{{{sel}}}", w)
            p99 = self._scalar(f"histogram_quantile(0.99, {buckets})")
            drift = self._scalar(f"max(serving_drift_psi{{{sel}}})")
            llm = {name: self._scalar(f"histogram_quantile(0.99, {self._since('sum by (le) ', f'{metric}_bucket{{{sel}}}', w)})")
                   for name, metric in LLM_HISTOGRAMS.items()}
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ConnectionError(f"Prometheus at {self.url} could not answer: {exc}") from exc
        return Window(requests=requests, errors=errors, p99_s=p99 if requests else None, drift=drift, **llm)
