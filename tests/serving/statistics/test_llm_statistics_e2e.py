"""Generation statistics end to end: the real vLLM engine (launcher), a worker, the statistics service and a
real Prometheus scraping the service and the launcher's /metrics, as `serving up --prometheus` configures it.
One engine for the module.

Checked: token counters equal the ``usage`` the ``openai`` client got; TTFT counted once per stream, the
inter-token histogram once per gap between the content chunks the client got, e2e once per request;
finish reasons as the client saw them; the engine's own metrics labelled with endpoint and version (its
generation-token counter moved by the same tokens); every query of the LLM dashboard uses names a real
scrape has and runs in Prometheus.
"""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.settings import LLMSettings
from serving.statistics.prometheus_config import REPO, start_prometheus
from serving.testmodels_llm import build_tiny_llama
from tests.serving.stack import make_stack
from tests.serving.statistics.promql import dashboard_expressions, grafana_query, metric_names
from tests.serving.statistics.support import Prometheus
from tests.support.ci import cannot_run, require_module
from tests.support.procs import free_port, stop, wait_until

openai = require_module("openai")
START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
# the engine's start counts against the test that waits for it (pytest-timeout's 300 s default is below START_S)
pytestmark = pytest.mark.timeout(START_S + 180)
DASHBOARD = REPO / "grafana" / "dashboards" / "llm.json"
# series that exist only once a shadow copy was compared (this module sends none): checked against the
# statistics service's declared families instead of Prometheus (shadow traffic: test_llm_rollouts_e2e)
SHADOW_ONLY = {"serving_llm_shadow_agreement_bucket", "serving_llm_shadow_agreement_sum",
               "serving_llm_shadow_agreement_count"}
SEL = '{endpoint="chat",version="1"}'


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("llm-statistics")
    bundle = build_tiny_llama(root / "tiny-llama")
    stack = make_stack(root / "home", workers=1)
    prom = None
    try:
        stack.start_control_plane()
        stack.start_statistics()
        stack.start_llm()
        stack.start_worker(0)
        stack.cli("model", "upload", "--name", "tiny", "--path", str(bundle.path))
        res = subprocess.run([sys.executable, "-m", "serving.cli.main", "model", "add", "--engine", "vllm",
                              "--endpoint", "chat", "--name", "tiny", "--aux-config", "max_model_len=512", "--wait",
                              "--wait-timeout", str(START_S)], env=stack.env, cwd=REPO, capture_output=True,
                             text=True, timeout=START_S + 60)
        assert res.returncode == 0, res.stdout + res.stderr
        port = free_port()
        workdir = root / "prometheus"
        workdir.mkdir()
        prom = start_prometheus(workdir, [stack.statistics_url().removeprefix("http://")], f"127.0.0.1:{port}",
                                scrape_interval="1s", llm_targets=[stack.llm_launcher_url.removeprefix("http://")])
        stack.prom = Prometheus(f"http://127.0.0.1:{port}")
        yield stack
    finally:
        if prom is not None:
            stop(prom)
        stack.stop_all()


def launcher_sample(stack, name: str, **labels: str) -> float:
    text = httpx.get(f"{stack.llm_launcher_url}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


@pytest.fixture(scope="module")
def traffic(stack):
    """Streams and non-streaming requests as a user sends them; what the client got of each."""
    before = launcher_sample(stack, "vllm:generation_tokens_total", endpoint="chat", version="1")
    c = openai.OpenAI(api_key="-", base_url=f"{stack.worker_url()}/serve/openai/v1", max_retries=0)
    got = {"prompt": 0, "completion": 0, "streams": 0, "gaps": 0, "requests": 0, "reasons": Counter()}
    for i, max_tokens in enumerate((6, 9, 4)):
        chunks = c.chat.completions.create(model="chat", messages=[{"role": "user", "content": f"tell me {i}"}],
                                           max_tokens=max_tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        contents, reason, usage = 0, None, None
        for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                contents += bool(choice.delta.content)
                reason = choice.finish_reason or reason
        got["streams"] += 1
        got["gaps"] += contents - 1
        got["reasons"][reason] += 1
        got["prompt"] += usage.prompt_tokens
        got["completion"] += usage.completion_tokens
    for prompt, max_tokens in (("the quick brown fox", 5), ("hello", 3)):
        r = c.completions.create(model="chat", prompt=prompt, max_tokens=max_tokens, temperature=0)
        got["reasons"][r.choices[0].finish_reason] += 1
        got["prompt"] += r.usage.prompt_tokens
        got["completion"] += r.usage.completion_tokens
    got["requests"] = got["streams"] + 2
    got["engine_tokens"] = launcher_sample(stack, "vllm:generation_tokens_total", endpoint="chat",
                                           version="1") - before
    return got


def test_token_counts_equal_the_usage_the_client_got(stack, traffic):
    prom = stack.prom
    prom.wait_value(f"sum(serving_llm_completion_tokens_total{SEL})", traffic["completion"], timeout=60)
    assert prom.scalar(f"sum(serving_llm_prompt_tokens_total{SEL})") == traffic["prompt"]
    assert prom.scalar(f"sum(serving_llm_completion_tokens_per_request_sum{SEL})") == traffic["completion"]
    assert prom.scalar(f"sum(serving_llm_prompt_tokens_per_request_count{SEL})") == traffic["requests"]
    # the engine's own counter, scraped through the launcher with the endpoint's labels, saw the same tokens
    assert traffic["engine_tokens"] == traffic["completion"]
    prom.wait_value(f'sum(vllm:generation_tokens_total{SEL})', launcher_sample(
        stack, "vllm:generation_tokens_total", endpoint="chat", version="1"), timeout=30)


def test_ttft_per_stream_itl_per_gap_e2e_per_request_and_finish_reasons(stack, traffic):
    prom = stack.prom
    prom.wait_value(f"sum(serving_llm_e2e_latency_seconds_count{SEL})", traffic["requests"], timeout=60)
    assert traffic["gaps"] > 0
    assert prom.scalar(f"sum(serving_llm_time_to_first_token_seconds_count{SEL})") == traffic["streams"]
    assert prom.scalar(f"sum(serving_llm_inter_token_latency_seconds_count{SEL})") == traffic["gaps"]
    ttft_sum = prom.scalar(f"sum(serving_llm_time_to_first_token_seconds_sum{SEL})")
    assert 0 < ttft_sum <= prom.scalar(f"sum(serving_llm_e2e_latency_seconds_sum{SEL})")
    for reason, n in traffic["reasons"].items():
        assert prom.scalar(f'sum(serving_llm_finish_reason_total{{endpoint="chat",reason="{reason}"}})') == n
    assert prom.scalar(f'sum(serving_llm_finish_reason_total{{endpoint="chat"}})') == traffic["requests"]
    assert prom.scalar(f'sum(serving_requests_total{{endpoint="chat",status="200"}})') == traffic["requests"]


def test_engine_queue_gauges_and_the_dashboard_queries(stack, traffic):
    prom = stack.prom
    prom.wait_value(f"sum(serving_llm_e2e_latency_seconds_count{SEL})", traffic["requests"], timeout=60)
    for gauge in ("serving_llm_requests_running", "serving_llm_requests_waiting"):
        prom.wait_value(f"{gauge}{SEL}", 0.0, timeout=30)  # the series exists; nothing is in flight now
    names = prom.metric_names()
    exprs = list(dashboard_expressions(DASHBOARD))
    assert len(exprs) >= 15
    for where, expr in exprs:
        used = metric_names(expr)
        assert used, f"{where}: no metric in {expr!r}"
        missing = used - names - SHADOW_ONLY
        assert not missing, f"{where}: {sorted(missing)} not in Prometheus"
        prom.query(grafana_query(expr, {}))  # raises unless valid PromQL
    assert declared_names() >= SHADOW_ONLY, "the statistics service no longer declares the shadow agreement"


def declared_names() -> set[str]:
    """Every sample name the statistics service's shadow families can export."""
    from prometheus_client import CollectorRegistry

    from serving.statistics.metrics import ShadowMetrics

    registry = CollectorRegistry()
    ShadowMetrics(registry)
    return {f"{family.name}{suffix}" for family in registry.collect() for suffix in ("_bucket", "_sum", "_count")}
