"""The workers' requests in flight, summed over every worker pod: what their HPA scales on.

Each worker answers ``GET /metrics`` with the requests it holds now, all its processes summed
(serving/worker/load.py). The pods are found as the workers find Triton's: a headless Service's name
resolves to one address per ready pod (serving/dns.py). Every ``interval_s`` each pod is read
and the sum is one sample; the signal is the mean of the last ``window_s``. A pod that does not
answer is left out of that sample (it is starting, or going); when none answers there is no sample,
and with no sample in the window the API returns no value, so the HPA holds the scale rather than
acting on a guess.
"""
from __future__ import annotations

import asyncio
import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

from registry.autoscaling.signals import Reading, Window
from serving import dns
from serving.load_metrics import IN_FLIGHT

log = logging.getLogger(__name__)


class WorkerLoad:
    name = IN_FLIGHT

    def __init__(self, workers: str, interval_s: float = 1.0, window_s: float = 10.0, timeout_s: float = 2.0) -> None:
        host, _, port = workers.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"the workers' address must be host:port, not {workers!r}")
        self.host, self.port = host, int(port)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.window = Window(window_s)
        self.pods = 0  # pods that answered the last sample

    def value(self) -> Reading | None:
        return self.window.reading()

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            while True:
                started = loop.time()
                await self.sample(client)
                await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    async def sample(self, client: httpx.AsyncClient) -> None:
        found = await asyncio.to_thread(dns.addresses, self.host, self.port, "the workers' pods")
        answers = await asyncio.gather(*(self._read(client, ip) for _, ip in found))
        got = [a for a in answers if a is not None]
        self.pods = len(got)
        if got:
            self.window.add(sum(got))

    async def _read(self, client: httpx.AsyncClient, ip: str) -> float | None:
        host = f"[{ip}]" if ":" in ip else ip
        try:
            r = await client.get(f"http://{host}:{self.port}/metrics")
            r.raise_for_status()
            return next(s.value for f in text_string_to_metric_families(r.text) for s in f.samples if s.name == IN_FLIGHT)
        except (httpx.HTTPError, StopIteration, ValueError) as exc:
            log.debug("worker %s: no load read (%s)", ip, exc)
            return None
