"""Rollout gates on LLM endpoints' time to first token and inter-token latency, without an engine:
the gate rule, the request schema, and the statistics service source reading the generation
histograms (the contract's names) from a real /metrics over HTTP (prometheus_client's own server)."""
from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from registry.rollout_metrics import LLM_HISTOGRAMS, PrometheusSource, StatisticsServiceSource, Window
from registry.rollouts import gate_failure
from registry.schemas import RolloutStart


@pytest.mark.parametrize("window, gates, words", [
    (Window(50, 0, 0.9, None, ttft_p99_s=0.8), {"max_ttft_p99_ms": 500},
     "time to first token p99 800 ms > 500 ms over 50 requests"),
    (Window(50, 0, 0.9, None, itl_p99_s=0.12), {"max_itl_p99_ms": 100},
     "inter-token latency p99 120 ms > 100 ms over 50 requests"),
    (Window(50, 0, 0.9, None, ttft_p99_s=0.2, itl_p99_s=0.05), {"max_ttft_p99_ms": 500, "max_itl_p99_ms": 100}, None),
    (Window(50, 0, 0.9, None), {"max_ttft_p99_ms": 500, "max_itl_p99_ms": 100}, None),  # no figure: not judged
    (Window(50, 5, 0.9, None, ttft_p99_s=0.2), {"max_error_rate": 0.01, "max_ttft_p99_ms": 500},
     "error rate 10.0% > 1.0% (5 of 50 requests were not 2xx)"),
])
def test_llm_gates(window, gates, words):
    assert gate_failure(window, gates) == words


def test_the_request_carries_the_llm_gates_only_when_given():
    base = {"endpoint": "chat", "model": "tiny", "steps": [50, 100], "interval_s": 5}
    assert "max_ttft_p99_ms" not in RolloutStart(**base).gates()
    gates = RolloutStart(**base, max_ttft_p99_ms=300, max_itl_p99_ms=40).gates()
    assert gates["max_ttft_p99_ms"] == 300 and gates["max_itl_p99_ms"] == 40
    with pytest.raises(ValueError):
        RolloutStart(**base, max_ttft_p99_ms=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_statistics_service_source_differences_the_llm_histograms():
    registry = CollectorRegistry()
    buckets = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
    hists = {name: Histogram(metric[len("serving_"):], "test", ["endpoint", "version"], buckets=buckets,
                             namespace="serving", registry=registry) for name, metric in LLM_HISTOGRAMS.items()}
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        source = StatisticsServiceSource(f"http://127.0.0.1:{port}")
        for _ in range(100):  # before the step: fast, must not count
            hists["ttft_p99_s"].labels("chat", "2").observe(0.02)
        start = source.snapshot("chat", 2)
        for _ in range(100):
            hists["ttft_p99_s"].labels("chat", "2").observe(0.8)
            hists["itl_p99_s"].labels("chat", "2").observe(0.04)
            hists["ttft_p99_s"].labels("chat", "1").observe(3.0)  # the other version: not this one's
        window = source.window("chat", 2, start, 60)
        assert 0.5 < window.ttft_p99_s <= 1.0 and 0.01 < window.itl_p99_s <= 0.05
        assert gate_failure(window, {"max_ttft_p99_ms": 500}).startswith("time to first token p99")
    finally:
        server.shutdown()
        thread.join()


def test_promql_asks_for_the_llm_quantiles():
    asked: list[str] = []

    class Source(PrometheusSource):
        def _scalar(self, query: str):
            asked.append(query)
            return 0.7 if "time_to_first_token" in query else 10.0

    window = Source("http://prometheus").window("chat", 2, None, 60)
    assert window.ttft_p99_s == 0.7
    ttft = next(q for q in asked if "time_to_first_token" in q)
    assert ttft.startswith("histogram_quantile(0.99, ") and 'endpoint="chat",version="2"' in ttft and "offset 60s" in ttft
