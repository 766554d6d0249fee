"""Run PyTorch models inside the worker with torch: the versions whose ONNX export does not apply.

``serving model upload`` exports a PyTorch file to ONNX where onnxruntime agrees with torch
(serving/pytorch/choose.py); the others keep their PyTorch file and are served here: TorchScript
with ``torch.jit.load``, an exported program with ``torch.export.load(...).module()``, a state dict by
building its model file's class and loading the weights (serving/pytorch/loading.py: the same code
the upload checked them with). A state dict's model file is user code and runs here, as a
``preprocess.py`` does.

Like the onnxruntime engine (onnxruntime.py): a ``"tensors"`` engine (the data plane matches the
request to the version's signature first; tensors go to ``forward`` positionally in the
signature's order, outputs come back under the signature's names), models loaded when a config is
applied and kept by the same holder bookkeeping (onnxruntime_sessions.py: a model that left the
config is kept a little while for requests that read the previous one), inferences on a thread pool
under ``torch.inference_mode()`` so the event loop keeps accepting requests. ``SERVING_TORCH_THREADS``
is torch's intra-op thread count in each worker process (one by default: one inference per core side
by side, as onnxruntime's engine runs them), and the pool runs cores / threads inferences at once.
"""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from serving.worker.engines.onnxruntime_sessions import Sessions
from serving.worker.errors import BadRequest, brief
from serving.worker.runtime import Target


class TorchModels(Sessions):
    """One loaded model per artifact: the onnxruntime holder's bookkeeping, torch's loading."""

    def __init__(self, artifact_path: Callable[[str], Path]) -> None:
        super().__init__(artifact_path)
        self._frameworks: dict[str, str] = {}

    def prepare(self, target: Target) -> None:
        self._frameworks[target.artifact] = target.framework
        super().prepare(target)

    def _load(self, artifact: str) -> Any:
        from serving.pytorch.loading import load_module

        try:
            return load_module(self.artifact_path(artifact), self._frameworks[artifact])
        except ImportError as exc:
            raise RuntimeError(f"{exc}: engine torch needs PyTorch in the worker (`pip install torch`)") from exc


class TorchEngine:
    kind = "tensors"  # the data plane matches request tensors to the version's signature first

    def __init__(self, models: TorchModels, threads: int = 1, parallel: int = 1) -> None:
        self.models = models
        self.threads = max(1, threads)
        self.parallel = max(1, parallel)
        self._executor = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="torch")
        self._threads_set = False

    def prepare(self, target: Target) -> None:
        self._set_threads()
        self.models.prepare(target)

    def _set_threads(self) -> None:
        """torch's thread count is the process's: set once, when the first model loads (not at
        worker start, so a worker that serves no PyTorch model never imports torch)."""
        if not self._threads_set:
            import torch

            torch.set_num_threads(self.threads)
            self._threads_set = True

    def retain(self, targets: Iterable[Target]) -> None:
        self.models.retain(targets)

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        model = await self.models.acquire(target)
        names_in = [s["name"] for s in target.inputs] or list(inputs)
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._executor, _forward, model, [inputs[n] for n in names_in])
        except Exception as exc:  # the model's own errors for values it cannot take (an index past a table, ...)
            raise BadRequest(f"torch rejected the input for {target.model}:{target.version}: {brief(exc)}") from None
        names_out = target.output_names or [f"output__{i}" for i in range(len(outputs))]
        if len(names_out) != len(outputs):
            raise RuntimeError(f"{target.model}:{target.version} returned {len(outputs)} outputs; its signature "
                               f"names {len(names_out)}")
        return dict(zip(names_out, outputs))

    def is_ready(self, target: Target) -> bool:
        return self.models.is_ready(target)

    async def ready(self, target: Target) -> bool:
        return self.is_ready(target)

    async def close(self) -> None:
        self.models.close()
        self._executor.shutdown(wait=False)


def _forward(model: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """On the executor: numpy in, numpy out, no autograd."""
    import torch

    from serving.pytorch.loading import flatten
    from serving.pytorch.samples import to_numpy

    tensors = [torch.from_numpy(np.array(a, copy=True)) for a in arrays]  # writable, owned: torch may keep them
    with torch.inference_mode():
        out = model(*tensors)
    return [to_numpy(t) for t in flatten(out)]


def create(settings: Any, artifact_path: Callable[[str], Path]) -> TorchEngine:
    threads = max(1, int(getattr(settings, "torch_threads", 1) or 1))
    return TorchEngine(TorchModels(artifact_path), threads, max(1, (os.cpu_count() or 1) // threads))
