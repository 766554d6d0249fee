"""Drift: shifted text traffic raises PSI and KS above threshold, reference-like traffic does not.

The end-to-end tests send texts through worker processes and read the gauges back
through a real Prometheus; the unit tests pin the score functions to known cases.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from serving.statistics.drift import DriftConfig, DriftMonitor, psi_categorical, psi_numeric, score
from tests.serving.statistics.support import Prometheus, Service, run_workers

THRESHOLD = DriftConfig().psi_threshold
REFERENCE_SIZE = 200  # support.DRIFT_ARGS


def _series(prom: Prometheus, metric: str, endpoint: str) -> dict[str, float]:
    return {r["metric"]["variable"]: float(r["value"][1])
            for r in prom.query(f'{metric}{{endpoint="{endpoint}", version="1"}}')}


def test_shifted_text_distribution_raises_drift(prom: Prometheus, stats_service: Service) -> None:
    run_workers(stats_service.env, [("drift-e", 1, REFERENCE_SIZE, "reference", 31)])  # learned reference
    # one process, so the live window (the last 200 values) is the same on every run
    run_workers(stats_service.env, [("drift-e", 1, 400, "shifted", 32)])
    prom.wait_value('serving_drift_window_size{endpoint="drift-e", variable="tokens"}', 200.0)
    prom.wait_value('serving_drift_detected{endpoint="drift-e", variable="tokens"}', 1.0)

    psi = _series(prom, "serving_drift_psi", "drift-e")
    assert psi["tokens"] > THRESHOLD and psi["label"] > THRESHOLD, psi
    assert _series(prom, "serving_drift_detected", "drift-e") == {"tokens": 1.0, "label": 1.0, "score": 0.0}
    ks_p = _series(prom, "serving_drift_ks_pvalue", "drift-e")
    ks_stat = _series(prom, "serving_drift_ks_statistic", "drift-e")
    assert ks_stat["tokens"] == 1.0 and ks_p["tokens"] < 1e-6  # 4..14 words against 30..90
    assert "label" not in ks_p  # KS only for numeric variables
    assert prom.scalar("serving_drift_psi_threshold") == THRESHOLD
    # the shipped alert condition holds for exactly the drifted variables
    fired = {r["metric"]["variable"] for r in prom.query('serving_drift_detected{endpoint="drift-e"} == 1')}
    assert fired == {"tokens", "label"}
    print(f"drift-e PSI {psi}, KS statistic {ks_stat}, KS p-value {ks_p}")


def test_reference_distribution_traffic_stays_below_threshold(prom: Prometheus, stats_service: Service) -> None:
    run_workers(stats_service.env, [("stable-e", 1, REFERENCE_SIZE, "reference", 41)])
    # one process, so the live window (the last 200 values) is the same on every run
    run_workers(stats_service.env, [("stable-e", 1, 400, "reference", 42)])
    prom.wait_value('serving_drift_window_size{endpoint="stable-e", variable="tokens"}', 200.0)
    prom.wait_value('count(serving_drift_psi{endpoint="stable-e"})', 3.0)

    psi = _series(prom, "serving_drift_psi", "stable-e")
    assert set(psi) == {"tokens", "label", "score"}
    assert max(psi.values()) < THRESHOLD, psi
    assert _series(prom, "serving_drift_detected", "stable-e") == {"tokens": 0.0, "label": 0.0, "score": 0.0}
    ks_p = _series(prom, "serving_drift_ks_pvalue", "stable-e")
    ks_stat = _series(prom, "serving_drift_ks_statistic", "stable-e")
    assert max(ks_stat.values()) < 0.2 and min(ks_p.values()) > 0.001, (ks_stat, ks_p)  # the KS alert stays off
    print(f"stable-e PSI {psi}, KS statistic {ks_stat}, KS p-value {ks_p}")


# --- score functions -----------------------------------------------------------------


def test_psi_is_near_zero_for_one_distribution_and_large_for_a_shift() -> None:
    rng = np.random.default_rng(0)
    ref, same, shifted = rng.normal(0, 1, 5000), rng.normal(0, 1, 5000), rng.normal(1, 1, 5000)
    assert psi_numeric(ref, same) < 0.02
    assert psi_numeric(ref, shifted) > 0.5
    assert psi_numeric(ref, ref) == pytest.approx(0.0, abs=1e-12)


def test_psi_categorical_counts_new_categories() -> None:
    ref = ["a"] * 50 + ["b"] * 50
    assert psi_categorical(ref, ["b", "a"] * 40) == pytest.approx(0.0, abs=1e-12)
    assert psi_categorical(ref, ["a"] * 50 + ["c"] * 50) > 1.0  # "c" never seen in the reference


def test_score_kinds() -> None:
    config = DriftConfig()
    enum = score("enum", ["x", "y"] * 20, ["x"] * 40, config)
    assert enum.ks_statistic is None and enum.ks_pvalue is None and enum.drifted
    rng = random.Random(1)
    numeric = score("scalar", [rng.gauss(0, 1) for _ in range(500)], [rng.gauss(3, 1) for _ in range(500)], config)
    assert numeric.drifted and numeric.ks_statistic > 0.8 and numeric.ks_pvalue < 1e-10


def test_monitor_learns_reference_then_scores_a_sliding_window() -> None:
    monitor = DriftMonitor(DriftConfig(reference_size=100, window_size=50, min_window=20))
    learned: list[list[float]] = []
    monitor.on_reference_complete = lambda key, kind, values: learned.append(values)
    key = ("e", "1", "x")
    for i in range(100):
        monitor.add(key, "scalar", i % 10)
    assert learned == [[float(i % 10) for i in range(100)]]
    for i in range(19):
        monitor.add(key, "scalar", i % 10)
    assert monitor.scores() == {}  # below min_window: no score yet
    monitor.add(key, "scalar", 5)
    assert not monitor.scores()[key].drifted
    for _ in range(50):  # the window slides: old values leave it
        monitor.add(key, "scalar", 1000)
    result = monitor.scores()[key]
    assert result.drifted and result.window_size == 50 and result.reference_size == 100
    monitor.add(key, "scalar", "not a number")  # ignored, not raised


def test_uploaded_reference_is_not_overwritten_by_traffic() -> None:
    monitor = DriftMonitor(DriftConfig(reference_size=10, window_size=20, min_window=5))
    key = ("e", "1", "x")
    monitor.set_reference(key, "scalar", list(range(100)), uploaded=True)
    for _ in range(5):
        monitor.add(key, "scalar", 500)
    result = monitor.scores()[key]
    assert result.reference_size == 100 and result.window_size == 5 and result.drifted
