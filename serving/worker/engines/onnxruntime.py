"""Run small models inside the worker with onnxruntime: no Triton hop, no batching across requests.

The engine runs inferences; which sessions it holds is a holder's job, chosen at ``create``:
every session opened when a config is applied (serving/worker/engines/onnxruntime_sessions.py),
or, under a memory budget (``SERVING_WORKER_MEMORY_BUDGET_MB``), sessions opened on a model's
first request, least recently used idle ones closed to make room
(serving/worker/engines/onnxruntime_budget.py).
Inferences run on an executor so the event loop keeps accepting requests. Concurrent requests
run as ``parallel`` inferences of ``threads`` intra-op threads each (default: one per core, one
thread each): on a CPU, single-text inferences side by side keep the cores busier than one
inference split across them (benchmarks: about 1.3x on MiniLM-L6, 1.9x on a tiny BERT).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from serving.ort import string_feeds
from serving.worker.engines.onnxruntime_budget import BudgetedSessions
from serving.worker.engines.onnxruntime_sessions import Sessions
from serving.worker.errors import BadRequest, brief
from serving.worker.runtime import Target


class OnnxRuntimeEngine:
    kind = "tensors"  # the data plane matches preprocess output to the model signature first

    def __init__(self, sessions: Sessions, parallel: int = 1) -> None:
        self.sessions = sessions
        self.parallel = max(1, parallel)  # calls worth running at once (serving/embeddings/token_batcher.py)
        # session.run is thread-safe and releases the GIL, so one session serves every thread
        self._executor = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="onnxruntime")

    def prepare(self, target: Target) -> None:
        self.sessions.prepare(target)

    def retain(self, targets: Iterable[Target]) -> None:
        self.sessions.retain(targets)

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        session = await self.sessions.acquire(target)
        try:
            names = target.output_names or [o.name for o in session.get_outputs()]
            loop = asyncio.get_running_loop()
            try:
                feeds = string_feeds(inputs)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            try:
                values = await loop.run_in_executor(self._executor, self.sessions.run, target.artifact, session,
                                                    names, feeds)
            except Exception as exc:  # onnxruntime raises its own types for bad shapes/dtypes
                raise BadRequest(f"onnxruntime rejected the input for {target.model}:{target.version}: "
                                 f"{brief(exc)}") from None
        finally:
            self.sessions.release(target.artifact)
        return dict(zip(names, values))

    def is_ready(self, target: Target) -> bool:
        return self.sessions.is_ready(target)

    async def ready(self, target: Target) -> bool:
        return self.is_ready(target)

    def memory(self) -> dict[str, Any]:
        """Open sessions, and under a budget the bytes charged for them."""
        return self.sessions.memory()

    async def close(self) -> None:
        self.sessions.close()
        self._executor.shutdown(wait=False)


def create(settings: Any, artifact_path: Callable[[str], Path]) -> OnnxRuntimeEngine:
    budget_mb = int(getattr(settings, "worker_memory_budget_mb", 0) or 0)
    if budget_mb > 0:  # sessions open on demand, within the budget
        sessions: Sessions = BudgetedSessions(artifact_path, budget_mb * 1024 * 1024, settings.ort_threads,
                                              wait_s=settings.infer_timeout_s)
    else:
        sessions = Sessions(artifact_path, settings.ort_threads)
    return OnnxRuntimeEngine(sessions, settings.resolved_ort_parallel())
