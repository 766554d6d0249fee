"""Which token batcher an encoder request's rows join: one per endpoint version and its encoder.

The data plane asks :meth:`EncoderBatching.run` for an encoder endpoint's model call (embeddings,
cross-encoder scores: preprocess/encoder.py) instead of calling the engine itself. The batcher
(serving/embeddings/token_batcher.py) calls the engine on each batch it forms and pools it there
(the encoder's ``reduce``), so only one vector or score a text comes back. A batcher belongs to the
(endpoint, version, encoder) it was made for: a redeployed endpoint with other options gets a new
one, and batchers of definitions no longer in the config are let go.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

from serving.worker.runtime import Config, Target
from serving.embeddings.token_batcher import TokenBatcher

Key = tuple[str, int, str, int]


def encoder_of(processor: Any) -> Any:
    """The processor when it pools per engine call (an encoder endpoint's), else None."""
    return processor if callable(getattr(processor, "reduce", None)) else None


class EncoderBatching:
    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        self._batchers: dict[Key, TokenBatcher] = {}

    async def run(self, endpoint: str, engine: Any, target: Target, inputs: dict[str, np.ndarray],
                  lengths: np.ndarray, pad: Mapping[str, int], encoder: Any,
                  led: list[int] | None = None) -> dict[str, np.ndarray]:
        key = (endpoint, target.version, target.artifact, id(encoder))
        batcher = self._batchers.get(key)
        if batcher is None:
            self._prune()
            batcher = self._batchers[key] = TokenBatcher(
                _sender(engine, target, pad, encoder), encoder.max_batch_tokens, target.max_batch or None,
                getattr(engine, "parallel", 0) or max(2, os.cpu_count() or 1))
        return await batcher.submit(inputs, lengths, pad, led)

    def _prune(self) -> None:
        current = {(name, t.version, t.artifact, id(ep.processor_for(t)))
                   for name, ep in self.config().endpoints.items() for t in ep.targets}
        self._batchers = {k: b for k, b in self._batchers.items() if k in current}


def _sender(engine: Any, target: Target, pad: Mapping[str, int], encoder: Any) -> Any:
    async def send(inputs: dict[str, np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
        return encoder.reduce(await engine.infer(target, inputs, pad), lengths)
    return send
