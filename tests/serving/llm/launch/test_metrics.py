"""The launcher's /metrics over its engines (serving/llm/launch/metrics.py), without starting vLLM: the engine
is a plain HTTP server answering a vLLM-shaped exposition (the real one is read in
tests/serving/statistics/test_llm_statistics_e2e.py)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.llm.launch.metrics import EngineMetrics, engine_endpoints
from serving.llm.launch.http import EnginesServer
from tests.support.procs import free_port

EXPOSITION = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny:1"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny:1"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny:1"} 4.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny:1"} 17.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="tiny:1"} 1.7e9
"""
SNAPSHOT = {"endpoints": {
    "chat": {"engine": "vllm", "targets": [{"model": "tiny", "version": 1}, {"model": "tiny", "version": 2}]},
    "chat-b": {"engine": "vllm", "targets": [{"model": "tiny", "version": 1}]},
    "remote": {"engine": "vllm", "engine_options": {"url": "http://gpu:8000/v1"}, "targets": [{"model": "big", "version": 1}]},
    "clf": {"engine": "onnxruntime", "targets": [{"model": "clf", "version": 1}]}}}


@pytest.fixture(scope="module")
def engine_url():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(EXPOSITION)))
            self.end_headers()
            self.wfile.write(EXPOSITION)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_engine_endpoints_are_the_launchers_own_vllm_endpoints():
    assert engine_endpoints(SNAPSHOT) == {"tiny:1": ["chat", "chat-b"], "tiny:2": ["chat"]}


def test_each_ready_engine_relabelled_per_endpoint_with_queue_gauges(engine_url):
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: left out of the scrape
    view = {"engines": {"tiny:1": {"url": engine_url, "state": "ready"},
                        "tiny:2": {"url": closed, "state": "ready"},
                        "tiny:3": {"url": engine_url, "state": "starting"}}}
    metrics = EngineMetrics(lambda: view)
    metrics.follow(SNAPSHOT)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server = EnginesServer(lambda: view, "127.0.0.1", 0, metrics=lambda: generate_latest(registry)).start()
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    for endpoint in ("chat", "chat-b"):
        assert samples["serving_llm_requests_running", (("endpoint", endpoint), ("version", "1"))] == 3.0
        assert samples["serving_llm_requests_waiting", (("endpoint", endpoint), ("version", "1"))] == 4.0
        key = ("vllm:generation_tokens_total", (("endpoint", endpoint), ("engine", "0"), ("model_name", "tiny:1"),
                                                ("version", "1")))
        assert samples[key] == 17.0
    assert not [k for k in samples if "_created" in k[0] or ("version", "2") in k[1] or ("version", "3") in k[1]]


def test_the_replicas_of_an_engine_are_each_scraped_and_their_queues_summed(engine_url):
    view = {"engines": {"tiny:1": {"url": engine_url, "state": "ready", "replicas": [
        {"id": "0", "url": engine_url, "state": "ready"}, {"id": "1", "url": engine_url, "state": "ready"},
        {"id": "2", "url": engine_url, "state": "starting"}]}}}
    metrics = EngineMetrics(lambda: view)
    metrics.follow(SNAPSHOT)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert samples["serving_llm_requests_running", (("endpoint", "chat"), ("version", "1"))] == 6.0
    assert samples["serving_llm_requests_waiting", (("endpoint", "chat"), ("version", "1"))] == 8.0
    for replica in ("0", "1"):
        key = ("vllm:generation_tokens_total", (("endpoint", "chat"), ("engine", "0"), ("model_name", "tiny:1"),
                                                ("replica", replica), ("version", "1")))
        assert samples[key] == 17.0
    assert not [k for k in samples if ("replica", "2") in k[1]], "a replica not ready is not scraped"
