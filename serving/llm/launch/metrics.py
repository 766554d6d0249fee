"""The engines' own Prometheus metrics, on the launcher's ``GET /metrics``, labelled with the platform's
endpoint and model version (docs/llm-statistics.md).

Each ready engine's ``/metrics`` (vLLM's ``vllm:*`` families) is read when Prometheus scrapes the
launcher, and passed on with ``endpoint`` and ``version`` added: one copy per endpoint that the engine
serves (endpoints deploying one version with equal options share it: serving/llm/naming.py). From its queue gauges
come ``serving_llm_requests_running`` and ``serving_llm_requests_waiting``, summed over vLLM's own
engine index, so dashboards and alerts need not know vLLM's names. An engine that does not answer within
``SCRAPE_TIMEOUT_S`` is left out of that scrape (its series go stale), never the launcher's answer.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterator

import httpx
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from serving.llm.naming import LLM_ENGINES, engine_key, lora_base

log = logging.getLogger(__name__)
_QUEUE_LINE = re.compile(rb"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.eE+-]+)", re.M)


def engine_queue(metrics: bytes) -> float:
    """Requests running plus waiting, from vLLM's Prometheus text (summed over its engine indexes): what a
    worker's least-loaded policy balances, and what the launcher waits to see at 0 before stopping a
    replaced engine."""
    return sum(float(m) for m in _QUEUE_LINE.findall(metrics))

SCRAPE_TIMEOUT_S = 2.0
QUEUE = {"vllm:num_requests_running": "serving_llm_requests_running",
         "vllm:num_requests_waiting": "serving_llm_requests_waiting"}
QUEUE_HELP = {"serving_llm_requests_running": "Requests the engine is generating for (vLLM's num_requests_running).",
              "serving_llm_requests_waiting": "Requests queued in the engine (vLLM's num_requests_waiting)."}


def engine_endpoints(snapshot: dict[str, Any]) -> dict[str, list[str]]:
    """An engine's key (serving/llm/naming.py) -> the ``vllm`` endpoints (without an external ``url``) that route to it."""
    out: dict[str, list[str]] = {}
    endpoints = snapshot.get("endpoints") or {}
    for name in sorted(endpoints):
        ep = endpoints[name]
        if ep.get("engine") not in LLM_ENGINES or (ep.get("engine_options") or {}).get("url"):
            continue
        for t in ep.get("targets") or []:
            if lora_base(t.get("signature")) is not None:
                continue  # a LoRA adapter runs in its base's engine: its own figures are the workers' statistics
            out.setdefault(engine_key(t["model"], int(t["version"]), ep.get("engine_options")), []).append(name)
    return out


class EngineMetrics:
    """A prometheus_client collector over the launcher's engines (``view``: ``Launcher.view``)."""

    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        self.view = view
        self.endpoints: dict[str, list[str]] = {}
        self.client = httpx.Client(timeout=SCRAPE_TIMEOUT_S)

    def follow(self, snapshot: dict[str, Any]) -> None:
        self.endpoints = engine_endpoints(snapshot)

    def collect(self) -> Iterator[Metric]:
        queue = {name: GaugeMetricFamily(name, QUEUE_HELP[name], labels=["endpoint", "version"]) for name in QUEUE_HELP}
        sums: dict[tuple[str, str, str], float] = {}
        relabelled: dict[str, Metric] = {}
        endpoints = self.endpoints
        for key, engine in sorted(self.view().get("engines", {}).items()):
            names = endpoints.get(key)
            if not names:
                continue
            version = key.rsplit(":", 1)[1].partition("@")[0]  # naming.engine_key: MODEL:VERSION[@options]
            replicas = engine.get("replicas") or [{"id": "0", "url": engine.get("url"), "state": engine.get("state")}]
            for replica in replicas:
                text = self._scrape(key, replica["url"]) if replica.get("state") == "ready" else None
                if text is None:
                    continue
                extra = {"replica": str(replica["id"])} if len(replicas) > 1 else {}  # one series per process
                for family in text_string_to_metric_families(text):
                    self._add(family, names, version, extra, relabelled, sums)
        for (name, endpoint, version), value in sorted(sums.items()):
            queue[name].add_metric([endpoint, version], value)
        yield from relabelled.values()
        yield from queue.values()

    def _scrape(self, key: str, url: str) -> str | None:
        base = url.removesuffix("/").removesuffix("/v1")
        try:
            r = self.client.get(f"{base}/metrics")
            r.raise_for_status()
            return r.text
        except httpx.HTTPError as exc:
            log.info("engine %s: no metrics this scrape: %s", key, exc)
            return None

    @staticmethod
    def _add(family: Metric, endpoints: list[str], version: str, extra: dict[str, str], out: dict[str, Metric],
             sums: dict[tuple[str, str, str], float]) -> None:
        samples = [s for s in family.samples if not s.name.endswith("_created")]  # the start times: noise here
        if not samples:
            return
        copy = out.get(family.name)
        if copy is None:
            copy = out[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
        for endpoint in endpoints:
            copy.samples.extend(Sample(s.name, {**s.labels, **extra, "endpoint": endpoint, "version": version},
                                       s.value, s.timestamp, s.exemplar) for s in samples)
            if family.name in QUEUE:
                at = (QUEUE[family.name], endpoint, version)
                sums[at] = sums.get(at, 0.0) + sum(s.value for s in family.samples)
