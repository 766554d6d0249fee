"""What the data plane needs from an engine.

Two kinds, told apart by ``kind``: ``"tensors"`` engines (Triton, onnxruntime) get
named tensors matched to the model's signature; ``"python"`` engines (scikit-learn,
XGBoost, LightGBM, custom) get whatever ``preprocess`` returned, as ClearML Serving
hands it to them. Engines are chosen by name (``engines/registry.py``).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

import numpy as np

from serving.worker.runtime import Target


class Engine(Protocol):
    kind: str  # "tensors" | "python"

    def prepare(self, target: Target) -> None:
        """Called off the event loop when a config is applied (load sessions, warm caches)."""

    def retain(self, targets: Iterable[Target]) -> None:
        """Drop whatever serves targets no longer in the config."""

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """``pad``: a pad value per input when the inputs are token sequences that may be padded
        (the tokenizer preprocessor's); an engine that batches across requests may use it."""

    async def ready(self, target: Target) -> bool: ...

    # optional; without it a target is ready once prepare() returned (serving/worker/gate.py)
    def is_ready(self, target: Target) -> bool:
        """Blocking readiness check from the config thread: may this target get traffic now?"""

    # optional, "python" engines: the version's model is what the user's ``Preprocess.load`` returned
    # (ClearML); called instead of prepare(), off the event loop
    def adopt(self, target: Target) -> None:
        """Serve ``target`` with the processor's ``loaded`` model: ready without loading the file."""

    # "python" engines instead of infer():
    async def run(self, target: Target, processor: Any, data: Any, state: dict, collect: Any) -> Any:
        """Run the version's model (or the user's ``process``) on the preprocess output."""

    async def close(self) -> None: ...
