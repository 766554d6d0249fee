"""What the worker's held requests (serving/llm/engines/wake.py) did, on the worker's ``GET /metrics``.

A worker runs several processes and ``/metrics`` is answered by one of them, so each process keeps plain
numbers here (:data:`HOLD_STATS`), hands them to its siblings through the statistics exchange
(serving/worker/stats_exchange.py, key ``llm_hold``) and the answering process sums them
(:func:`collector`): gauges, counters and histogram buckets all add up across processes.

- ``serving_llm_held_requests_now{engine}``: requests held now for an engine waking from zero;
- ``serving_llm_held_requests_total{engine,outcome}``: how holds ended: ``answered`` (the engine became
  ready and the request went on to it), ``refused_full`` (``SERVING_LLM_HOLD_MAX`` already held),
  ``timed_out`` (not ready within ``SERVING_LLM_HOLD_S``), ``cancelled`` (the client went away),
  ``failed`` (the engine failed or was removed while the request waited);
- ``serving_llm_hold_seconds{engine}``: how long an ``answered`` request was held.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

HELD = "serving_llm_held_requests_now"
HELD_TOTAL = "serving_llm_held_requests_total"
HOLD_SECONDS = "serving_llm_hold_seconds"
OUTCOMES = ("answered", "refused_full", "timed_out", "cancelled", "failed")
# a cold start of vLLM on a cluster takes tens of seconds; the default bound is 180 s
BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0)


@dataclass
class HoldStats:
    """One process's numbers, as JSON-ready dicts keyed by engine key."""

    held: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)  # per bucket of BUCKETS, then +Inf; not cumulative
    sums: dict[str, float] = field(default_factory=dict)

    def begin(self, engine: str) -> None:
        self.held[engine] = self.held.get(engine, 0) + 1

    def end(self, engine: str) -> None:
        self.held[engine] = self.held.get(engine, 0) - 1

    def outcome(self, engine: str, outcome: str, held_s: float | None = None) -> None:
        per = self.outcomes.setdefault(engine, {})
        per[outcome] = per.get(outcome, 0) + 1
        if held_s is not None:
            counts = self.counts.setdefault(engine, [0] * (len(BUCKETS) + 1))
            counts[next((i for i, le in enumerate(BUCKETS) if held_s <= le), len(BUCKETS))] += 1
            self.sums[engine] = self.sums.get(engine, 0.0) + held_s

    def snapshot(self) -> dict[str, Any]:
        return {"held": dict(self.held), "outcomes": {k: dict(v) for k, v in self.outcomes.items()},
                "counts": {k: list(v) for k, v in self.counts.items()}, "sums": dict(self.sums)}


HOLD_STATS = HoldStats()  # this process's: one LLM engine client per worker process


def merged(snapshots: Iterable[dict[str, Any]]) -> HoldStats:
    """The sum of several processes' snapshots."""
    total = HoldStats()
    for snap in snapshots:
        for engine, n in (snap.get("held") or {}).items():
            total.held[engine] = total.held.get(engine, 0) + int(n)
        for engine, per in (snap.get("outcomes") or {}).items():
            into = total.outcomes.setdefault(engine, {})
            for outcome, n in per.items():
                into[outcome] = into.get(outcome, 0) + int(n)
        for engine, counts in (snap.get("counts") or {}).items():
            into_counts = total.counts.setdefault(engine, [0] * (len(BUCKETS) + 1))
            for i, n in enumerate(counts[: len(into_counts)]):
                into_counts[i] += int(n)
        for engine, s in (snap.get("sums") or {}).items():
            total.sums[engine] = total.sums.get(engine, 0.0) + float(s)
    return total


class _Collector:
    def __init__(self, stats: HoldStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(HELD, "Requests held for an LLM engine starting from zero, all this worker's "
                                 "processes", labels=["engine"])
        for engine, n in sorted(self.stats.held.items()):
            held.add_metric([engine], n)
        yield held
        total = CounterMetricFamily(HELD_TOTAL, "Requests held for an LLM engine starting from zero, by how "
                                    "their hold ended", labels=["engine", "outcome"])
        for engine, per in sorted(self.stats.outcomes.items()):
            for outcome, n in sorted(per.items()):
                total.add_metric([engine, outcome], n)
        yield total
        seconds = HistogramMetricFamily(HOLD_SECONDS, "How long a request was held before its LLM engine was "
                                        "ready", labels=["engine"])
        for engine, counts in sorted(self.stats.counts.items()):
            cumulative, buckets = 0, []
            for le, n in zip([*map(str, BUCKETS), "+Inf"], counts):
                cumulative += n
                buckets.append((le, cumulative))
            seconds.add_metric([engine], buckets, self.stats.sums.get(engine, 0.0))
        yield seconds


def collector(payloads: list[Any]) -> _Collector:
    """A prometheus_client collector over every process's exchange payload (their ``llm_hold`` snapshots)."""
    return _Collector(merged(p["llm_hold"] for p in payloads if isinstance(p, dict) and p.get("llm_hold")))
