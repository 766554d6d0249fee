"""Per endpoint-version counters in Triton's statistics-extension shape (``GET /v2/models/stats``, gRPC
``ModelStatistics``), so ``tritonclient``'s ``get_inference_statistics`` reads a worker as it reads Triton.

Why counters here and not the statistics service: the extension answers "since the server started"
and must be exact (every request, never sampled by ``log_freq``, never late behind a transport);
the data plane already times every request (lifecycle.py's ``RequestStats``), and adding its numbers up costs a
dict lookup. Each worker process counts what it served; a statistics request sums the counters of
every process of the worker (stats_exchange.py).

Mapping of the data plane's stages: ``preprocess`` -> ``compute_input``, ``inference`` (the engine
call, with any wait for the engine inside it) -> ``compute_infer``, ``postprocess`` ->
``compute_output``. ``queue`` is counted with 0 ns: the worker has no queue of its own in front of
the engine. Only requests routed to a version count; one refused before (unknown endpoint, a body
that is not v2) has no version to count against, as Triton does not count requests it cannot parse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

STAGES = {"preprocess": "compute_input", "inference": "compute_infer", "process": "compute_infer",
          "postprocess": "compute_output"}
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")
NS = 1_000_000_000

Key = tuple[str, int]  # (endpoint, version)


@dataclass
class VersionCounters:
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    durations: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in DURATIONS})

    def add(self, key: str, seconds: float) -> None:
        cell = self.durations[key]
        cell[0] += 1
        cell[1] += max(0, int(seconds * NS))

    def merge(self, other: "VersionCounters") -> None:
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        self.last_inference_ms = max(self.last_inference_ms, other.last_inference_ms)
        for key, (count, ns) in other.durations.items():
            cell = self.durations.setdefault(key, [0, 0])
            cell[0] += count
            cell[1] += ns

    def to_row(self, key: Key) -> list:
        """One row of the exchange between a worker's processes (plain JSON)."""
        return [key[0], key[1], self.inference_count, self.execution_count, self.last_inference_ms,
                {k: list(v) for k, v in self.durations.items()}]

    @classmethod
    def from_row(cls, row: list) -> tuple[Key, "VersionCounters"]:
        name, version, inferences, executions, last, durations = row
        counters = cls(int(inferences), int(executions), int(last))
        counters.durations.update({str(k): [int(v[0]), int(v[1])] for k, v in durations.items()})
        return (str(name), int(version)), counters

    def as_triton(self, name: str, version: int) -> dict:
        """One ``$model_stat`` of Triton's extension (its JSON names are the protobuf's)."""
        return {"name": name, "version": str(version), "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count, "execution_count": self.execution_count,
                "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in self.durations.items()},
                "batch_stats": [], "memory_usage": [], "response_stats": {}}


class VersionStatistics:
    """Counters by (endpoint, version), fed once per request by the data plane (on the event loop)."""

    def __init__(self) -> None:
        self.counters: dict[Key, VersionCounters] = {}
        self.exchange: Any = None  # stats_exchange.StatsExchange, set by the app once it listens

    async def gather(self) -> dict[Key, VersionCounters]:
        """This worker's counters: every process's when the exchange runs, else this process's."""
        if self.exchange is None:
            return merged(self.rows())
        return merged(*(payload["versions"] for payload in await self.exchange.gather()))

    def observe(self, endpoint: str, version: int | None, status: int, latency_s: float,
                stages: Mapping[str, float], ts: float) -> None:
        if version is None:
            return
        counters = self.counters.get((endpoint, version))
        if counters is None:
            counters = self.counters[(endpoint, version)] = VersionCounters()
        counters.last_inference_ms = int(ts * 1000)
        if status != 200:
            counters.add("fail", latency_s)
            return
        d = counters.durations
        d["success"][0] += 1
        d["success"][1] += int(latency_s * NS)
        counters.inference_count += 1
        counters.execution_count += 1
        d["queue"][0] += 1
        for key in ("compute_input", "compute_infer", "compute_output"):
            d[key][0] += 1
        for stage, seconds in stages.items():
            key = STAGES.get(stage)
            if key is not None:
                d[key][1] += int(seconds * NS)

    def rows(self) -> list[list]:
        return [counters.to_row(key) for key, counters in self.counters.items()]


def merged(*row_sets: Iterable[list]) -> dict[Key, VersionCounters]:
    """The sum of several processes' rows."""
    total: dict[Key, VersionCounters] = {}
    for rows in row_sets:
        for row in rows:
            key, counters = VersionCounters.from_row(row)
            total.setdefault(key, VersionCounters()).merge(counters)
    return total


def model_stats(counters: Mapping[Key, VersionCounters], versions: Iterable[Key]) -> dict:
    """Triton's ``$stats_model_response`` for these (endpoint, version) pairs, zeros where none came."""
    return {"model_stats": [counters.get(key, VersionCounters()).as_triton(*key) for key in versions]}
