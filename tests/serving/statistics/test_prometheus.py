"""A real Prometheus scrapes the statistics service while worker processes record.

Every figure is read back through PromQL, as a dashboard or alert would read it,
and compared with what the worker processes sent (their events are deterministic).
"""
from __future__ import annotations

import math

import httpx

from tests.serving.statistics.support import Prometheus, Service, run_workers
from tests.serving.statistics.worker_sim import SCALAR_BUCKETS, make_events


def test_request_counter_and_histograms_add_up_across_workers(prom: Prometheus, stats_service: Service) -> None:
    jobs = [("count-e", 1, 700, "reference", 11), ("count-e", 2, 300, "reference", 12)]
    results = run_workers(stats_service.env, jobs)
    assert sum(r["sent"] for r in results) == 1000

    total = 'sum(serving_requests_total{endpoint="count-e"})'
    assert prom.wait_value(total, 1000.0) == 1000.0
    assert prom.scalar('sum(serving_requests_total{endpoint="count-e", version="1"})') == 700.0
    assert prom.scalar('sum(serving_requests_total{endpoint="count-e", version="2"})') == 300.0
    # every 10th simulated request fails with a 500
    assert prom.scalar('sum(serving_requests_total{endpoint="count-e", status="500"})') == 100.0

    assert prom.scalar('sum(serving_request_latency_seconds_count{endpoint="count-e"})') == 1000.0
    assert prom.scalar('sum(serving_request_latency_seconds_bucket{endpoint="count-e", le="+Inf"})') == 1000.0
    for stage in ("preprocess", "inference", "postprocess"):
        assert prom.scalar(f'sum(serving_stage_latency_seconds_count{{endpoint="count-e", stage="{stage}"}})') == 1000.0

    events = [e for job in jobs for e in make_events(*job)]
    latency_sum = prom.scalar('sum(serving_request_latency_seconds_sum{endpoint="count-e"})')
    assert math.isclose(latency_sum, sum(e["latency_s"] for e in events), rel_tol=1e-9)
    within_100ms = sum(1 for e in events if e["latency_s"] <= 0.1)
    assert prom.scalar('sum(serving_request_latency_seconds_bucket{endpoint="count-e", le="0.1"})') == within_100ms

    # aggregatable across replicas and versions: a quantile over the summed buckets
    p95 = prom.scalar('histogram_quantile(0.95, sum by (le) (serving_request_latency_seconds_bucket{endpoint="count-e"}))')
    assert 0.1 < p95 <= 0.25, p95  # simulated latencies are 2.6 ms .. 203 ms, uniform


def test_latencies_are_histograms_never_summaries(prom: Prometheus, stats_service: Service) -> None:
    prom.wait_for('count(serving_request_latency_seconds_bucket)', lambda v: v > 0)
    metadata = httpx.get(prom.url + "/api/v1/metadata", timeout=10).json()["data"]
    types = {name: entries[0]["type"] for name, entries in metadata.items() if name.startswith("serving_")}
    assert types["serving_request_latency_seconds"] == "histogram"
    assert types["serving_stage_latency_seconds"] == "histogram"
    assert types.get("serving_requests", types.get("serving_requests_total")) == "counter"
    assert "summary" not in types.values(), types


def test_declared_variables_have_right_buckets_labels_and_values(prom: Prometheus, stats_service: Service) -> None:
    job = ("vars-e", 3, 250, "shifted", 21)  # "shifted" also reports an undeclared label value
    run_workers(stats_service.env, [job])
    events = make_events(*job)
    tokens = [e["custom"]["tokens"] for e in events]
    prom.wait_value('serving_variable_scalar_count{endpoint="vars-e", variable="tokens"}', 250.0)

    # scalar: a histogram with exactly the declared buckets, cumulative, le = value <= bound
    result = prom.query('serving_variable_scalar_bucket{endpoint="vars-e", version="3", variable="tokens"}')
    got = {r["metric"]["le"]: float(r["value"][1]) for r in result}
    want = {_le(b): float(sum(1 for t in tokens if t <= b)) for b in SCALAR_BUCKETS}
    want["+Inf"] = 250.0
    assert got == want
    assert prom.scalar('serving_variable_scalar_sum{endpoint="vars-e", variable="tokens"}') == float(sum(tokens))

    # enum: a counter per declared value, undeclared values under "other"
    result = prom.query('serving_variable_enum_total{endpoint="vars-e", version="3", variable="label"}')
    got = {r["metric"]["value"]: float(r["value"][1]) for r in result}
    labels = [e["custom"]["label"] for e in events]
    assert got == {"POSITIVE": labels.count("POSITIVE"), "NEGATIVE": labels.count("NEGATIVE"),
                   "other": labels.count("UNSURE")}
    assert got["other"] > 0

    # value: a gauge holding the last value reported
    value = prom.query('serving_variable_value{endpoint="vars-e", variable="score"}')
    assert len(value) == 1 and value[0]["metric"]["version"] == "3"
    assert float(value[0]["value"][1]) == events[-1]["custom"]["score"]

    # undeclared variables export nothing
    assert prom.query('{endpoint="vars-e", variable!~"tokens|label|score", variable=~".+"}') == []


def _le(bound: float) -> str:
    """Prometheus' text form of a bucket bound, as scraped from prometheus-client."""
    return f"{float(bound)}"
