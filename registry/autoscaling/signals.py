"""What the metrics API serves: named signals, each a sampled number over a short window.

A signal is a plug-in: the metrics API answers for every signal it is given by name (pod_metrics.py has
the kinds read from pods' Prometheus metrics; catalogue.py lists them).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol, Sequence


@dataclass(frozen=True)
class Reading:
    value: float
    at: float          # wall-clock time of the newest sample (the API's timestamp)
    samples: int       # samples averaged


class Signal(Protocol):
    name: str

    def value(self) -> Reading | None:
        """The signal now, or None when it has no recent sample (the HPA then leaves the scale as it is)."""
        ...


def sampling(samplers: Sequence[Any], after: Callable[[], None] = lambda: None) -> Callable[[Any], Any]:
    """A server's lifespan: the samplers' ``run()`` go on while it serves; ``after`` once it stops."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(s.run()) for s in samplers]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            after()
    return lifespan
