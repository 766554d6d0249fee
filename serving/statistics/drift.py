"""Drift of each declared variable: a reference distribution against a live window.

Reference: the first ``reference_size`` values a version reports after it is
deployed (or first seen), unless one was uploaded. Live: a sliding window of the
last ``window_size`` values. Scores:

* PSI (population stability index) for every kind. Numeric variables are binned
  at the reference's deciles (so every bin holds ~10% of the reference, whatever
  the declared buckets), enums by value. Empty bins are floored at ``1e-4``.
  Rule of thumb: < 0.1 stable, 0.1-0.2 moderate, > 0.2 drifted (the default threshold).
* Two-sample Kolmogorov-Smirnov statistic and p-value (scipy) for numeric
  variables (scalar, and value too, since its values are numbers).

The drift flag is ``psi >= psi_threshold``: PSI does not grow with window size the
way KS p-values shrink, so it makes a stable alert; the p-value is exported for
those who prefer a test.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from serving.statistics.metrics import as_number

EPS = 1e-4
SeriesKey = tuple[str, str, str]  # endpoint, version label, variable


@dataclass(frozen=True)
class DriftConfig:
    reference_size: int = 1000
    window_size: int = 1000
    min_window: int = 100      # no score until the live window holds this many values
    psi_threshold: float = 0.2
    bins: int = 10


@dataclass(frozen=True)
class DriftScore:
    psi: float
    ks_statistic: float | None
    ks_pvalue: float | None
    drifted: bool
    reference_size: int
    window_size: int


def _psi_counts(ref: np.ndarray, live: np.ndarray) -> float:
    p = np.maximum(ref / max(ref.sum(), 1), EPS)
    q = np.maximum(live / max(live.sum(), 1), EPS)
    return float(np.sum((q - p) * np.log(q / p)))


def psi_numeric(reference: Sequence[float], live: Sequence[float], bins: int = 10) -> float:
    ref, cur = np.asarray(reference, dtype=float), np.asarray(live, dtype=float)
    edges = np.unique(np.quantile(ref, np.linspace(0, 1, bins + 1)[1:-1]))
    n = len(edges) + 1
    return _psi_counts(np.bincount(np.searchsorted(edges, ref, side="right"), minlength=n),
                       np.bincount(np.searchsorted(edges, cur, side="right"), minlength=n))


def psi_categorical(reference: Sequence[str], live: Sequence[str]) -> float:
    categories = sorted(set(reference) | set(live))
    index = {c: i for i, c in enumerate(categories)}
    ref = np.bincount([index[v] for v in reference], minlength=len(categories))
    cur = np.bincount([index[v] for v in live], minlength=len(categories))
    return _psi_counts(ref, cur)


def score(kind: str, reference: Sequence[Any], live: Sequence[Any], config: DriftConfig) -> DriftScore:
    if kind == "enum":
        psi, ks_stat, ks_p = psi_categorical(reference, live), None, None
    else:
        psi = psi_numeric(reference, live, config.bins)
        result = stats.ks_2samp(reference, live)
        ks_stat, ks_p = float(result.statistic), float(result.pvalue)
    return DriftScore(psi=psi, ks_statistic=ks_stat, ks_pvalue=ks_p, drifted=psi >= config.psi_threshold,
                      reference_size=len(reference), window_size=len(live))


@dataclass
class _Series:
    kind: str
    window: deque
    reference: list = field(default_factory=list)
    uploaded: bool = False
    dirty: bool = True
    last: DriftScore | None = None


class DriftMonitor:
    """Thread-safe drift state for every (endpoint, version, variable)."""

    def __init__(self, config: DriftConfig = DriftConfig()) -> None:
        self.config = config
        self._series: dict[SeriesKey, _Series] = {}
        self._lock = threading.Lock()
        self.on_reference_complete = lambda key, kind, values: None  # persistence hook

    def add(self, key: SeriesKey, kind: str, raw: Any) -> None:
        value = str(raw) if kind == "enum" else as_number(raw)
        if value is None:
            return
        with self._lock:
            series = self._get(key, kind)
            if len(series.reference) < self.config.reference_size and not series.uploaded:
                series.reference.append(value)
                if len(series.reference) == self.config.reference_size:
                    self.on_reference_complete(key, kind, list(series.reference))
            else:
                series.window.append(value)
                series.dirty = True

    def _get(self, key: SeriesKey, kind: str) -> _Series:
        series = self._series.get(key)
        if series is None or series.kind != kind:
            series = self._series[key] = _Series(kind, deque(maxlen=self.config.window_size))
        return series

    def set_reference(self, key: SeriesKey, kind: str, values: Sequence[Any], uploaded: bool) -> None:
        """Install a reference (uploaded, or learned earlier and reloaded from disk)."""
        clean = [str(v) if kind == "enum" else as_number(v) for v in values]
        with self._lock:
            series = self._get(key, kind)
            series.reference = [v for v in clean if v is not None]
            series.uploaded, series.dirty = uploaded, True

    def reset(self, key: SeriesKey) -> None:
        """Forget reference and window: the next values form a new reference."""
        with self._lock:
            self._series.pop(key, None)

    def retain(self, keep: Callable[[SeriesKey], bool]) -> None:
        """Drop series the config no longer has, so their drift flags cannot keep an alert firing."""
        with self._lock:
            self._series = {k: s for k, s in self._series.items() if keep(k)}

    def scores(self) -> dict[SeriesKey, DriftScore]:
        """Current scores; recomputed only for series that received values since."""
        with self._lock:
            todo = [(k, s, list(s.reference), list(s.window)) for k, s in self._series.items() if s.dirty]
            for _, s, _, _ in todo:
                s.dirty = False
        for key, series, reference, window in todo:
            if len(window) >= self.config.min_window and len(reference) >= 2:
                series.last = score(series.kind, reference, window, self.config)
        with self._lock:
            return {k: s.last for k, s in self._series.items() if s.last is not None}
