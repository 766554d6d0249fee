"""Every signal the metrics API serves, by the pods it reads (docs/deploy-helm.md#autoscaling).

| external metric | read from | the HPA's target |
|---|---|---|
| ``serving_worker_requests_in_flight`` | each worker's ``GET /metrics`` (serving/worker/load.py), summed | AverageValue |
| ``serving_triton_pending_requests`` | each Triton pod's ``nv_inference_pending_request_count``, summed | AverageValue |
| ``serving_triton_queue_ms`` | Triton's queue time per request over the window (``nv_inference_queue_duration_us`` / ``nv_inference_request_success``) | Value |
| ``serving_llm_waiting_requests`` | each vLLM pod's ``vllm:num_requests_waiting``, summed | AverageValue |
| ``serving_llm_kv_cache_usage`` | vLLM's KV-cache use (0 to 1; ``vllm:kv_cache_usage_perc``, before v1 ``vllm:gpu_cache_usage_perc``), the pods' mean | Value |
| ``serving_llm_ttft_ms`` | vLLM's mean time to first token over the window (its histogram's sum over its count) | Value |

A new signal is a line here: a ``PodsGauge`` or an ``IncreaseRatio`` of the pods it reads (pod_metrics.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from registry.autoscaling.pod_metrics import IncreaseRatio, PodScrape, PodsGauge
from registry.autoscaling.signals import Signal
from serving.load_metrics import IN_FLIGHT


@dataclass
class Signals:
    scrapes: list[PodScrape] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)


def signals(workers: str | None = None, triton: str | None = None, llm: str | None = None) -> Signals:
    """The signals of the pods named (each ``host:port`` of a headless Service; None: not read)."""
    out = Signals()
    if workers:
        scrape = PodScrape(workers, set())
        out.scrapes.append(scrape)
        out.signals.append(PodsGauge(IN_FLIGHT, scrape, (IN_FLIGHT,), "sum"))
    if triton:
        scrape = PodScrape(triton, set())
        out.scrapes.append(scrape)
        out.signals += [PodsGauge("serving_triton_pending_requests", scrape, ("nv_inference_pending_request_count",), "sum"),
                        IncreaseRatio("serving_triton_queue_ms", scrape, "nv_inference_queue_duration_us",
                                      "nv_inference_request_success", scale=1e-3)]
    if llm:
        scrape = PodScrape(llm, set())
        out.scrapes.append(scrape)
        out.signals += [PodsGauge("serving_llm_waiting_requests", scrape, ("vllm:num_requests_waiting",), "sum"),
                        PodsGauge("serving_llm_kv_cache_usage", scrape,
                                  ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "mean"),
                        IncreaseRatio("serving_llm_ttft_ms", scrape, "vllm:time_to_first_token_seconds_sum",
                                      "vllm:time_to_first_token_seconds_count", scale=1e3)]
    return out
