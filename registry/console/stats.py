"""What the console shows of the statistics service: its ``/metrics``, read per endpoint version.

The statistics service keeps cumulative counters only; the console reads them now for the
totals and percentiles it shows (so its numbers are the service's own), and keeps a sample
every ``EVERY_S`` (SERVING_CONSOLE_SAMPLE_S) for an hour in this process's memory, whence the rates and the charts over
the last 15 minutes and hour (a restarted control plane starts its history again; compose and
Helm have Prometheus and Grafana for longer ones). Percentiles come from the latency histogram
as Prometheus' ``histogram_quantile`` computes them (registry/rollout_metrics.py).
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from registry.rollout_metrics import quantile

EVERY_S = 5.0
KEEP_S = 3600.0
Key = tuple[str, str]  # (endpoint, version)


@dataclass
class Figures:
    """Cumulative figures of one endpoint version at one moment."""

    requests: float = 0.0
    errors: float = 0.0  # answers that were not 2xx
    latency: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    drift: dict[str, float] = field(default_factory=dict)  # variable -> PSI
    agree: float = 0.0  # shadow answers with the live answer's label
    disagree: float = 0.0
    completion_tokens: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)
    itl: dict[float, float] = field(default_factory=dict)  # LLM inter-token latency
    labelled: float = 0.0  # ground truth over the statistics service's live window (docs/prediction-log.md)
    accuracy: float | None = None
    mae: float | None = None

    def percentile(self, q: float) -> float | None:
        return quantile(q, self.latency)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def agreement(self) -> float | None:
        seen = self.agree + self.disagree
        return self.agree / seen if seen else None

    @property
    def max_drift(self) -> float | None:
        return max(self.drift.values()) if self.drift else None


def _add_bucket(buckets: dict[float, float], labels: dict, value: float) -> None:
    le = float(labels["le"])
    buckets[le] = buckets.get(le, 0.0) + value


def _requests(f: Figures, labels: dict, value: float) -> None:
    f.requests += value
    if not labels.get("status", "").startswith("2"):
        f.errors += value


def _drift(f: Figures, labels: dict, value: float) -> None:
    if not math.isnan(value):
        f.drift[labels.get("variable", "?")] = value


def _agreement(f: Figures, labels: dict, value: float) -> None:
    if labels.get("agree") == "true":
        f.agree += value
    else:
        f.disagree += value


def _tokens(f: Figures, _labels: dict, value: float) -> None:
    f.completion_tokens += value


# sample name -> how it adds into a version's Figures
READERS = {
    "serving_requests_total": _requests,
    "serving_request_latency_seconds_bucket": lambda f, lb, v: _add_bucket(f.latency, lb, v),
    "serving_drift_psi": _drift,
    "serving_shadow_label_agreement_total": _agreement,
    "serving_llm_completion_tokens_total": _tokens,
    "serving_llm_time_to_first_token_seconds_bucket": lambda f, lb, v: _add_bucket(f.ttft, lb, v),
    "serving_llm_inter_token_latency_seconds_bucket": lambda f, lb, v: _add_bucket(f.itl, lb, v),
    "serving_live_labelled": lambda f, lb, v: setattr(f, "labelled", v),
    "serving_live_accuracy": lambda f, lb, v: setattr(f, "accuracy", v),
    "serving_live_mae": lambda f, lb, v: setattr(f, "mae", v),
}


def parse(text: str) -> dict[Key, Figures]:
    """Every endpoint version's figures in one ``/metrics`` text."""
    out: dict[Key, Figures] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            reader = READERS.get(s.name)
            endpoint, version = s.labels.get("endpoint"), s.labels.get("version")
            if reader is None or endpoint is None or version is None:
                continue
            reader(out.setdefault((endpoint, version), Figures()), s.labels, s.value)
    return out


@dataclass(frozen=True)
class Point:
    """One version's figures between two samples: what a chart draws."""

    at: float
    rate: float | None
    errors: float | None
    p50_ms: float | None
    p99_ms: float | None
    drift: float | None
    tokens_per_s: float | None
    ttft_p99_ms: float | None
    itl_p99_ms: float | None


def _diff(end: dict[float, float], start: dict[float, float]) -> dict[float, float]:
    return {le: end[le] - start.get(le, 0.0) for le in end}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def between(start: Figures, end: Figures, seconds: float, at: float) -> Point:
    latency = _diff(end.latency, start.latency)
    return Point(at=at, rate=(end.requests - start.requests) / seconds, errors=end.errors - start.errors,
                 p50_ms=_ms(quantile(0.5, latency)), p99_ms=_ms(quantile(0.99, latency)), drift=end.max_drift,
                 tokens_per_s=(end.completion_tokens - start.completion_tokens) / seconds if end.ttft else None,
                 ttft_p99_ms=_ms(quantile(0.99, _diff(end.ttft, start.ttft))),
                 itl_p99_ms=_ms(quantile(0.99, _diff(end.itl, start.itl))))


class Statistics:
    """Reads the statistics service; keeps an hour of samples for rates and charts."""

    def __init__(self, url: str, clock=time.time, every_s: float = EVERY_S) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.clock = clock
        self.every_s = every_s
        self.samples: deque[tuple[float, dict[Key, Figures]]] = deque()
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def now(self) -> dict[Key, Figures]:
        """A fresh read (kept as a sample too); the last one when the service does not answer."""
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                text = (await client.get(self.url)).text
        except httpx.HTTPError as exc:
            self.error = f"the statistics service at {self.url} does not answer: {type(exc).__name__}"
            return self.samples[-1][1] if self.samples else {}
        self.error = None
        figures, at = parse(text), self.clock()
        if not self.samples or at - self.samples[-1][0] >= self.every_s / 2:
            self.samples.append((at, figures))
        while self.samples and at - self.samples[0][0] > KEEP_S:
            self.samples.popleft()
        return figures

    def ensure_sampling(self) -> None:
        """Started by the first console request (a mounted app gets no startup event of its own)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await self.now()
            await asyncio.sleep(self.every_s)

    def rate(self, key: Key, over_s: float = 60.0) -> float | None:
        """Requests per second over the last ``over_s`` (None until two samples span some time)."""
        if len(self.samples) < 2:
            return None
        end_at, end = self.samples[-1]
        start_at, start = next(((t, f) for t, f in self.samples if end_at - t <= over_s), self.samples[0])
        if end_at - start_at <= 0 or key not in end:
            return None
        return (end[key].requests - start.get(key, Figures()).requests) / (end_at - start_at)

    def since(self, window_s: float) -> float:
        """Where a chart of the last ``window_s`` starts: the window's start, or the first sample kept
        when the history is shorter (a control plane started a few minutes ago draws those minutes
        across the chart, not a sliver at its right edge)."""
        cut = self.clock() - window_s
        return max(cut, self.samples[0][0]) if self.samples else cut

    def series(self, key: Key, window_s: float) -> list[Point]:
        """Points between consecutive samples of the last ``window_s`` seconds."""
        cut = self.clock() - window_s
        kept = [(t, f) for t, f in self.samples if t >= cut]
        return [between(a.get(key, Figures()), b.get(key, Figures()), tb - ta, tb)
                for (ta, a), (tb, b) in zip(kept, kept[1:]) if tb > ta]
