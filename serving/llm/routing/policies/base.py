"""What a routing policy sees: the replicas of one engine and a hint drawn from the request.

A policy returns the replicas in the order to try them: the first gets the request, the next ones
get it should the first fail before answering (failover, serving/llm/engines/vllm.py). It is
given only replicas that may take a request (ready, not taken out after a failure).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


@dataclass(eq=False)
class Replica:
    """One engine process (or pod) of a model version, as this worker process sees it."""

    id: str                    # stable across restarts: the launcher's slot ("0", "1"), a pod's address
    url: str                   # its OpenAI base URL, ending in /v1
    ready: bool = True         # the launcher (or the name service) says it serves
    down: bool = False         # a connection to it failed; probed until it answers again
    adapters: frozenset[str] = frozenset()  # LoRA adapters loaded on it (their served names)
    in_flight: int = 0         # this worker process's requests on it now
    engine_queue: float | None = None  # running + waiting at the engine's last metrics read
    in_flight_at_read: int = 0  # this process's in_flight when that read was taken
    answered: int = 0          # requests it answered (tests, logs)

    @property
    def load(self) -> float:
        """Requests running and waiting there: the engine's last count (every worker's requests),
        corrected by what this process started or finished since; never less than its own."""
        if self.engine_queue is None:
            return float(self.in_flight)
        return max(float(self.in_flight), self.engine_queue + self.in_flight - self.in_flight_at_read)


@dataclass
class RouteHint:
    """What a request offers a policy; ``prefix`` is computed only when a policy asks (it tokenizes)."""

    session: str | None = None
    prefix: Callable[[], bytes | None] = field(default=lambda: None)


class Policy(Protocol):
    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]: ...


class Rotation:
    """A turn counter: ties (and round-robin) rotate, so an idle engine set still alternates."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def rotate(self, replicas: Sequence[Replica]) -> list[Replica]:
        if not replicas:
            return []
        k = next(self._turn) % len(replicas)
        return [*replicas[k:], *replicas[:k]]


def by_load(replicas: Sequence[Replica], rotation: Rotation) -> list[Replica]:
    """Fewest running and waiting first; among equals, the rotation's turn first."""
    return sorted(rotation.rotate(replicas), key=lambda r: r.load)  # sorted() is stable: ties keep the turn
