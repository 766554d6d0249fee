"""The figures a rollout gate reads, from both sources, against a real statistics service and a real
Prometheus scraping it: the statistics service's /metrics differenced, and PromQL over a window."""
from __future__ import annotations

import math

import pytest

from registry.rollout_metrics import PrometheusSource, Quality, StatisticsServiceSource, Window, quantile
from registry.rollouts import accuracy_verdict, gate_failure
from tests.serving.statistics.support import Prometheus, Service, run_workers
from tests.serving.statistics.worker_sim import make_events


def test_quantile_interpolates_like_histogram_quantile():
    buckets = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.99, buckets) == pytest.approx(0.2 + 0.3 * 9 / 10)
    assert quantile(0.99, {math.inf: 0.0}) is None


@pytest.mark.parametrize("window,gates,words", [
    (Window(100, 3, 0.05, None), {"max_error_rate": 0.01}, "error rate 3.0% > 1.0% (3 of 100 requests were not 2xx)"),
    (Window(100, 0, 0.35, None), {"max_p99_ms": 200}, "p99 latency 350 ms > 200 ms over 100 requests"),
    (Window(100, 0, 0.05, 0.4), {"max_drift": 0.2}, "drift (PSI) 0.400 > 0.2"),
    (Window(100, 1, 0.05, 0.1), {"max_error_rate": 0.01, "max_p99_ms": 200, "max_drift": 0.2}, None),
])
def test_gates(window, gates, words):
    assert gate_failure(window, gates) == words


@pytest.mark.parametrize("candidate,stable,gates,hold,failure", [
    (Quality(50, 0.80), Quality(400, 0.83), {"max_accuracy_drop": 0.05, "min_labelled": 50}, None, None),
    (Quality(50, 0.70), Quality(400, 0.83), {"max_accuracy_drop": 0.05, "min_labelled": 50}, None,
     "live accuracy 70.0% < the stable version's 83.0% less 5.0% (over 50 and 400 labelled requests)"),
    (Quality(49, 0.10), Quality(400, 0.83), {"max_accuracy_drop": 0.05, "min_labelled": 50},
     "holding: 49 labelled request(s) of the candidate and 400 of the stable version, 50 each needed to judge accuracy",
     None),
    (Quality(0, None), Quality(0, None), {}, None, None),  # no accuracy gate: nothing to judge
])
def test_the_accuracy_gate(candidate, stable, gates, hold, failure):
    assert accuracy_verdict(candidate, stable, gates) == (hold, failure)


def test_both_sources_agree_on_a_versions_window(prom: Prometheus, stats_service: Service) -> None:
    source = StatisticsServiceSource(stats_service.url)
    start = source.snapshot("gate-e", 2)
    jobs = [("gate-e", 2, 400, "reference", 21), ("gate-e", 1, 100, "reference", 22)]
    assert sum(r["sent"] for r in run_workers(stats_service.env, jobs)) == 500
    prom.wait_value('sum(serving_requests_total{endpoint="gate-e", version="2"})', 400.0)
    direct = source.window("gate-e", 2, start, 60)
    events = make_events(*jobs[0])
    assert direct.requests == 400 and direct.errors == sum(1 for e in events if e["status"] != 200)
    assert 0.1 < direct.p99_s <= 0.25  # simulated latencies run up to 203 ms
    promql = PrometheusSource(prom.url).window("gate-e", 2, None, 120)
    assert promql.requests == direct.requests and promql.errors == direct.errors
    assert promql.p99_s == pytest.approx(direct.p99_s, rel=1e-9)
