"""What the metrics API serves: named signals, each a sampled number averaged over a short window.

A signal is a plug-in: the metrics API answers for every signal it is given by name, so a new one
(Triton's queue, an LLM engine's waiting requests) is a new module with ``name`` and ``value()``.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol


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


class Window:
    """Samples of the last ``seconds``: their mean smooths one sample's luck without hiding a rise for long."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self._samples: deque[tuple[float, float, float]] = deque()  # (monotonic, wall clock, value)

    def add(self, value: float) -> None:
        self._samples.append((self.clock(), time.time(), value))
        self._trim()

    def reading(self) -> Reading | None:
        self._trim()
        if not self._samples:
            return None
        values = [v for _, _, v in self._samples]
        return Reading(sum(values) / len(values), self._samples[-1][1], len(values))

    def _trim(self) -> None:
        horizon = self.clock() - self.seconds
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
