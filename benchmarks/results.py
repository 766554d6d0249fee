"""What a run produces, as plain dataclasses: written to JSON, tabled, plotted."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class LevelResult:
    """One load level: a concurrency for HTTP systems, a batch size for the in-process ceiling."""

    concurrency: int
    requests: int
    errors: int
    duration_s: float
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    client_cpu_s: float = 0.0
    warmup_errors: int = 0
    first_error: str | None = None
    batch_size: int | None = None
    client: str = ""               # the load generator: wrk (timed levels) or httpx (fixed counts)

    @property
    def name(self) -> str:
        """``c=16`` for a load level; ``batch 8`` or ``batch 1 x 2 streams`` for the ceiling."""
        if not self.batch_size:
            return f"c={self.concurrency}"
        streams = f" x {self.concurrency} streams" if self.concurrency > 1 else ""
        return f"batch {self.batch_size}{streams}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LevelResult":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class SystemResult:
    workload: str
    system: str            # stable id, e.g. "platform-triton-batch-2w"
    label: str             # human-readable
    status: str = "ok"     # ok | unavailable | failed
    reason: str | None = None
    levels: list[LevelResult] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    ratio_ceiling: float | None = None
    ratio_baseline: float | None = None

    @property
    def best(self) -> LevelResult | None:
        """The level of highest throughput: what the system sustains at its best."""
        ok = [lv for lv in self.levels if lv.requests > 0]
        return max(ok, key=lambda lv: lv.rps) if ok else None

    @property
    def best_rps(self) -> float | None:
        best = self.best
        return best.rps if best else None

    @property
    def errors(self) -> int:
        return sum(lv.errors + lv.warmup_errors for lv in self.levels)


@dataclass
class RunResult:
    mode: str
    started_at: str
    machine: dict[str, Any]
    command: str
    corpus: dict[str, Any]
    results: list[SystemResult] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # why this run's numbers cannot be trusted (see validity)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for item, res in zip(data["results"], self.results):
            item["best_rps"] = res.best_rps
        return finite(data)


CEILING = "ceiling"
BASELINE = "fastapi-baseline"


def add_ratios(results: list[SystemResult]) -> None:
    """Each system's best throughput over the ceiling's and the baseline's, per workload."""
    for workload in {r.workload for r in results}:
        same = [r for r in results if r.workload == workload]
        ceiling = _best_of(same, CEILING)
        baseline = _best_of(same, BASELINE)
        for r in same:
            if r.best_rps is None:
                continue
            r.ratio_ceiling = r.best_rps / ceiling if ceiling else None
            r.ratio_baseline = r.best_rps / baseline if baseline else None


def validity(results: list[SystemResult]) -> list[str]:
    """A ceiling that a system beats by more than the spread of the ceiling's own repeats is no
    ceiling: the machine changed under the run, or the ceiling misses a layout. One line per
    system that does, per workload; empty when the run holds. Systems serving another model than
    the ceiling's (``--optimize``: ``upload_options``) are not bounded by it and are left out."""
    problems = []
    for workload in sorted({r.workload for r in results}):
        same = [r for r in results if r.workload == workload]
        ceiling = next((r for r in same if r.system == CEILING and r.best_rps), None)
        if ceiling is None:
            continue
        spread = ceiling.details.get("spread_rps", 0.0) or 0.0
        for r in same:
            if r is ceiling or not r.best_rps or r.details.get("upload_options"):
                continue
            if r.best_rps > ceiling.best_rps + spread:
                problems.append(f"{workload}: {r.system} {r.best_rps:.1f} req/s beats the ceiling "
                                f"{ceiling.best_rps:.1f} by more than its repeats' spread ({spread:.1f})")
    return problems


def _best_of(results: list[SystemResult], system: str) -> float | None:
    for r in results:
        if r.system == system and r.best_rps:
            return r.best_rps
    return None


def finite(value: Any) -> Any:
    """JSON has no NaN: a level without a successful request has no percentiles."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
