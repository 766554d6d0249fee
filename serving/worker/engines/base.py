"""What the data plane needs from a tensor engine."""
from __future__ import annotations

from typing import Iterable, Mapping, Protocol

import numpy as np

from serving.worker.runtime import Target


class Engine(Protocol):
    def prepare(self, target: Target) -> None:
        """Called off the event loop when a config is applied (load sessions, warm caches)."""

    def retain(self, targets: Iterable[Target]) -> None:
        """Drop whatever serves targets no longer in the config."""

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """``pad``: a pad value per input when the inputs are token sequences that may be padded
        (the tokenizer preprocessor's); an engine that batches across requests may use it."""

    async def ready(self, target: Target) -> bool: ...

    async def close(self) -> None: ...
