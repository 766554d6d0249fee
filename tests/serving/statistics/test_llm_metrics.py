"""Generation statistics through the statistics service's pipeline, no engine: the ``llm`` object of the
worker's events (serving/llm/relay/timing.py) counted exactly into serving_llm_* families."""
from __future__ import annotations

import shutil
import subprocess

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.statistics.events import encode_batch
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.prometheus_config import write_prometheus_config
from tests.support.ci import cannot_run


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def llm_event(version: int, ttft, itl, prompt, completion, reason, stream=True, status=200, **extra) -> dict:
    return {"endpoint": "chat", "version": version, "status": status, "latency_s": 0.5,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
            "llm": {"ttft_s": ttft, "itl_s": itl, "e2e_s": 0.5, "prompt_tokens": prompt,
                    "completion_tokens": completion, "finish_reason": reason, "stream": stream, **extra}}


def test_timings_tokens_and_finish_reasons_are_counted_once_per_request_and_gap():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    events = [llm_event(1, 0.05, [0.01, 0.02, 0.3], 9, 4, "length"),
              llm_event(1, 0.08, [0.01], 5, 2, "stop"),
              llm_event(1, None, [], 7, 3, "stop", stream=False),
              llm_event(2, 0.2, [0.04], 3, 2, "weird-new-reason"),
              llm_event(2, 0.1, [], 3, 0, None, status=499)]
    assert pipeline.handle_payload(encode_batch(events, source="w:1")) == 5
    v1, v2 = {"endpoint": "chat", "version": "1"}, {"endpoint": "chat", "version": "2"}
    assert sample(registry, "serving_llm_time_to_first_token_seconds_count", **v1) == 2  # not the non-stream
    assert sample(registry, "serving_llm_time_to_first_token_seconds_sum", **v1) == 0.05 + 0.08
    assert sample(registry, "serving_llm_inter_token_latency_seconds_count", **v1) == 4
    assert sample(registry, "serving_llm_inter_token_latency_seconds_bucket", **v1, le="0.01") == 2
    assert sample(registry, "serving_llm_inter_token_latency_seconds_count", **v2) == 1
    assert sample(registry, "serving_llm_e2e_latency_seconds_count", **v1) == 3
    assert sample(registry, "serving_llm_prompt_tokens_total", **v1) == 21
    assert sample(registry, "serving_llm_completion_tokens_total", **v1) == 9
    assert sample(registry, "serving_llm_completion_tokens_per_request_count", **v1) == 3
    assert sample(registry, "serving_llm_completion_tokens_per_request_sum", **v1) == 9
    assert sample(registry, "serving_llm_prompt_tokens_per_request_bucket", **v1, le="8.0") == 2  # 5 and 7
    assert sample(registry, "serving_llm_finish_reason_total", **v1, reason="stop") == 2
    assert sample(registry, "serving_llm_finish_reason_total", **v1, reason="length") == 1
    assert sample(registry, "serving_llm_finish_reason_total", **v2, reason="other") == 1
    assert sample(registry, "serving_llm_finish_reason_total", **v2, reason="none") == 1
    # every LLM request is a request as any other (error rates and rollout gates read these)
    assert sample(registry, "serving_requests_total", **v2, status="499") == 1
    # the exposition stays valid: counters and histograms do not share a family name
    families = {f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["serving_llm_prompt_tokens"] == "counter"
    assert families["serving_llm_prompt_tokens_per_request"] == "histogram"


def test_requests_without_llm_and_bad_llm_fields_cost_no_request():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    bad = llm_event(1, "soon", [0.01, -1, "x", float("nan")], -3, True, 42)
    plain = {"endpoint": "clf", "version": 1, "status": 200, "latency_s": 0.01}
    shadow = {**llm_event(1, 0.1, [0.01], 3, 2, "stop"), "shadow": {"live_version": 2}}
    assert pipeline.handle_payload(encode_batch([bad, plain, shadow])) == 3
    v1 = {"endpoint": "chat", "version": "1"}
    assert sample(registry, "serving_llm_time_to_first_token_seconds_count", **v1) == 0
    assert sample(registry, "serving_llm_inter_token_latency_seconds_count", **v1) == 1  # only the valid gap
    assert sample(registry, "serving_llm_prompt_tokens_total", **v1) == 0
    assert sample(registry, "serving_llm_finish_reason_total", **v1, reason="other") == 1
    assert sample(registry, "serving_requests_total", **v1, status="200") == 1  # the shadow copy is not counted
    assert sample(registry, "serving_llm_e2e_latency_seconds_count", endpoint="clf", version="1") == 0


def test_the_generated_prometheus_config_scrapes_the_launcher_and_promtool_accepts_it(tmp_path):
    if shutil.which("promtool") is None:
        cannot_run("promtool (Debian: prometheus, which scripts/setup.sh installs) is not installed")
    path = write_prometheus_config(tmp_path / "prometheus.yml", ["127.0.0.1:9999"], llm_targets=["127.0.0.1:8004"])
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in yaml.safe_load(path.read_text())["scrape_configs"]}
    assert jobs["serving-llm"] == ["127.0.0.1:8004"] and jobs["serving-statistics"] == ["127.0.0.1:9999"]
    check = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
