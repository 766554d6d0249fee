"""How busy a worker is: the requests it holds right now, across all its processes, on ``GET /metrics``.

Why this signal: a worker mostly waits on Triton or an LLM engine, so its CPU says little about how
loaded it is, while the requests it holds (from the moment their life starts to the moment it ends,
a stream's last byte included) grow at once when callers outpace it. The control plane reads this
from every worker pod and serves it to Kubernetes' HorizontalPodAutoscaler as an external metric
(registry/autoscaling/). ``/metrics`` is Prometheus' text format, so a user's Prometheus can scrape
it too. The processes of one worker are summed through their statistics exchange (stats_exchange.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from serving.load_metrics import IN_FLIGHT, PROCESSES



@dataclass
class InFlight:
    """This process's requests under way (the data plane counts them in its request lifecycle)."""

    value: int = 0
    exchange: Any = None  # stats_exchange.StatsExchange, set by the app once it listens

    def begin(self) -> None:
        self.value += 1

    def end(self) -> None:
        self.value -= 1

    async def payloads(self) -> list[Any]:
        """Every process's exchange payload (this one's alone before the exchange listens)."""
        return [{"in_flight": self.value}] if self.exchange is None else await self.exchange.gather()

    async def worker_total(self) -> tuple[int, int]:
        """(requests in flight, processes answering) for the whole worker."""
        return _total(await self.payloads())


def _total(payloads: list[Any]) -> tuple[int, int]:
    return sum(int(p.get("in_flight", 0)) for p in payloads), len(payloads)


class _Snapshot:
    """A collector of numbers already gathered (the exchange is asynchronous, collectors are not)."""

    def __init__(self, in_flight: int, processes: int) -> None:
        self.in_flight, self.processes = in_flight, processes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(IN_FLIGHT, "Requests this worker holds now, all its processes", value=self.in_flight)
        yield GaugeMetricFamily(PROCESSES, "Processes of this worker that answered", value=self.processes)


async def metrics_text(in_flight: InFlight, *more: Callable[[list[Any]], Any]) -> bytes:
    """``more``: collectors made from the same processes' payloads (the LLM engine's held requests)."""
    payloads = await in_flight.payloads()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(*_total(payloads)))  # type: ignore[arg-type]
    for make in more:
        registry.register(make(payloads))
    return generate_latest(registry)
