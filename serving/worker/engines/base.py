"""What the data plane needs from a tensor engine."""
from __future__ import annotations

from typing import Iterable, Protocol

import numpy as np

from serving.worker.runtime import Target


class Engine(Protocol):
    def prepare(self, target: Target) -> None:
        """Called off the event loop when a config is applied (load sessions, warm caches)."""

    def retain(self, targets: Iterable[Target]) -> None:
        """Drop whatever serves targets no longer in the config."""

    async def infer(self, target: Target, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    async def ready(self, target: Target) -> bool: ...

    async def close(self) -> None: ...
