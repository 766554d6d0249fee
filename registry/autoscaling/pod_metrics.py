"""Signals read from the Prometheus ``/metrics`` of every pod behind a headless Service.

One ``PodScrape`` per kind of pod (the workers, Triton's pods, the LLM engines' pods) reads every
ready pod each ``interval_s`` (the name resolves to one address per ready pod: serving/dns.py) and
keeps, per pod, the sum over label series of each metric its signals name. Signals are views of it:

- ``PodsGauge``: a gauge over the pods, summed (requests in flight, requests waiting: the HPA divides by
  the replicas itself) or averaged (KV-cache use), then averaged over the window;
- ``IncreaseRatio``: two counters' increase over the window, summed over the pods that stayed up, one
  over the other (Triton's queue time per request, vLLM's time to first token).

A pod that does not answer is left out of its sample (it is starting, or going). With no pod answering
there is no sample, and with no sample in the window the API answers no value: the HPA then holds its
scale rather than act on a guess.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable, Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from registry.autoscaling.signals import Reading
from serving import dns

log = logging.getLogger(__name__)
Sample = tuple[float, float, dict[str, dict[str, float]]]  # (monotonic, wall clock, pod -> metric -> value)


class PodScrape:
    def __init__(self, target: str, metrics: set[str], interval_s: float = 1.0, window_s: float = 10.0,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"the pods' address must be host:port, not {target!r}")
        self.host, self.port, self.metrics = host, int(port), set(metrics)
        self.interval_s, self.window_s, self.timeout_s, self.clock = interval_s, window_s, timeout_s, clock
        self.samples: deque[Sample] = deque()
        self.pods = 0  # pods that answered the last sample

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            while True:
                started = loop.time()
                await self.sample(client)
                await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    async def sample(self, client: httpx.AsyncClient) -> None:
        found = await asyncio.to_thread(dns.addresses, self.host, self.port, f"the pods of {self.host}")
        answers = await asyncio.gather(*(self._read(client, ip) for _, ip in found))
        got = {ip: values for (_, ip), values in zip(found, answers) if values is not None}
        self.pods = len(got)
        if got:
            self.samples.append((self.clock(), time.time(), got))
        self.recent()

    def recent(self) -> list[Sample]:
        horizon = self.clock() - self.window_s
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()
        return list(self.samples)

    async def _read(self, client: httpx.AsyncClient, ip: str) -> dict[str, float] | None:
        host = f"[{ip}]" if ":" in ip else ip
        try:
            r = await client.get(f"http://{host}:{self.port}/metrics")
            r.raise_for_status()
            values: dict[str, float] = {}
            for family in text_string_to_metric_families(r.text):
                for s in family.samples:
                    name = wanted(s.name, self.metrics)
                    if name is not None:
                        values[name] = values.get(name, 0.0) + s.value
            return values
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("%s: no metrics read (%s)", ip, exc)
            return None


def wanted(sample: str, metrics: set[str]) -> str | None:
    """The metric a sample is of, when wanted: prometheus_client's parser names a counter's samples
    ``<name>_total`` even where the text has ``<name>`` (Triton's ``nv_inference_request_success``)."""
    if sample in metrics:
        return sample
    if sample.endswith("_total") and sample[:-6] in metrics:
        return sample[:-6]
    return None


class PodsGauge:
    """A gauge over the pods (``sum`` or ``mean``), averaged over the window. ``metrics``: the first one a
    pod has is read (an engine's gauge renamed across its versions)."""

    def __init__(self, name: str, scrape: PodScrape, metrics: tuple[str, ...], across: Literal["sum", "mean"]) -> None:
        self.name, self.scrape, self.metrics, self.across = name, scrape, metrics, across
        scrape.metrics.update(metrics)

    def value(self) -> Reading | None:
        totals, samples = [], self.scrape.recent()
        for _, _, pods in samples:
            values = [next((v[m] for m in self.metrics if m in v), None) for v in pods.values()]
            present = [v for v in values if v is not None]
            if present:
                totals.append(sum(present) if self.across == "sum" else sum(present) / len(present))
        if not totals:
            return None
        return Reading(sum(totals) / len(totals), samples[-1][1], len(totals))


class IncreaseRatio:
    """``scale`` x (increase of ``numerator``) / (increase of ``denominator``) over the window, summed over the
    pods present at both its ends with counters that did not go back (a restarted pod starts again at 0).
    No increase of the denominator (nothing served): 0."""

    def __init__(self, name: str, scrape: PodScrape, numerator: str, denominator: str, scale: float = 1.0) -> None:
        self.name, self.scrape = name, scrape
        self.numerator, self.denominator, self.scale = numerator, denominator, scale
        scrape.metrics.update({numerator, denominator})

    def value(self) -> Reading | None:
        samples = self.scrape.recent()
        if len(samples) < 2:
            return None
        (_, _, first), (_, at, last) = samples[0], samples[-1]
        num = den = 0.0
        for pod, now in last.items():
            then = first.get(pod)
            if then is None or any(k not in then or k not in now for k in (self.numerator, self.denominator)):
                continue
            d_num, d_den = now[self.numerator] - then[self.numerator], now[self.denominator] - then[self.denominator]
            if d_num < 0 or d_den < 0:
                continue
            num, den = num + d_num, den + d_den
        return Reading(self.scale * num / den if den > 0 else 0.0, at, len(samples))
