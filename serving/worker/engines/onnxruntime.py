"""Run small models inside the worker with onnxruntime: no Triton hop, no batching across requests.

Sessions load when a config is applied (never on a request), one per model
artifact, and run on an executor so the event loop keeps accepting requests.
Under a memory budget (``SERVING_WORKER_MEMORY_BUDGET_MB``) they load on a model's
first request instead, least recently used idle ones closed to make room
(serving/worker/engines/onnxruntime_budget.py).
Concurrent requests run as ``parallel`` inferences of ``threads`` intra-op
threads each (default: one per core, one thread each): on a CPU, single-text
inferences side by side keep the cores busier than one inference split across
them (benchmarks: about 1.3x on MiniLM-L6, 1.9x on a tiny BERT).
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from serving.ort import session as ort_session
from serving.ort import string_feeds
from serving.worker.errors import BadRequest, ModelNotReady, brief
from serving.worker.runtime import Target

RETIRE_AFTER_S = 10.0  # a replaced session outlives the swap: requests that read the old config still use it


class OnnxRuntimeEngine:
    kind = "tensors"  # the data plane matches preprocess output to the model signature first

    def __init__(self, artifact_path: Callable[[str], Path], threads: int = 1, parallel: int = 1) -> None:
        self.artifact_path = artifact_path
        self.threads = threads
        self._sessions: dict[str, Any] = {}
        self._retired: dict[str, tuple[Any, float]] = {}  # artifact -> (session, when it left the config)
        self._lock = threading.Lock()
        # session.run is thread-safe and releases the GIL, so one session serves every thread
        self._executor = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="onnxruntime")

    def _load(self, artifact: str) -> Any:
        return ort_session(self.artifact_path(artifact), self.threads)

    def prepare(self, target: Target) -> None:
        with self._lock:
            if target.artifact not in self._sessions:
                retired = self._retired.pop(target.artifact, None)
                self._sessions[target.artifact] = retired[0] if retired else self._load(target.artifact)

    def retain(self, targets: Iterable[Target]) -> None:
        """Sessions no longer in the config are dropped RETIRE_AFTER_S later (at a later call): a
        request that read the previous config just before the swap still finds its session."""
        keep = {t.artifact for t in targets}
        now = time.monotonic()
        with self._lock:
            for artifact in set(self._sessions) - keep:
                self._retired[artifact] = (self._sessions.pop(artifact), now)
            for artifact in list(self._retired):
                if artifact in keep and artifact not in self._sessions:
                    self._sessions[artifact] = self._retired.pop(artifact)[0]
                elif now - self._retired[artifact][1] > RETIRE_AFTER_S:
                    del self._retired[artifact]

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        session = await self._acquire(target)
        try:
            names = target.output_names or [o.name for o in session.get_outputs()]
            loop = asyncio.get_running_loop()
            try:
                feeds = string_feeds(inputs)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            try:
                values = await loop.run_in_executor(self._executor, self._run, target.artifact, session, names, feeds)
            except Exception as exc:  # onnxruntime raises its own types for bad shapes/dtypes
                raise BadRequest(f"onnxruntime rejected the input for {target.model}:{target.version}: "
                                 f"{brief(exc)}") from None
        finally:
            self._release(target.artifact)
        return dict(zip(names, values))

    async def _acquire(self, target: Target) -> Any:
        """The open session for ``target``: every session opened at ``prepare``."""
        session = self._find(target.artifact)
        if session is None:
            raise ModelNotReady(f"model {target.model}:{target.version} is still loading")
        return session

    def _find(self, artifact: str) -> Any:
        """The artifact's session, in the config or retired from it; None when none is open."""
        session = self._sessions.get(artifact)
        return session if session is not None else (self._retired.get(artifact) or (None,))[0]

    def _release(self, artifact: str) -> None:
        """The inference that acquired ``artifact``'s session is over (a hook for the budget)."""

    def _run(self, artifact: str, session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
        return session.run(names, feeds)

    def is_ready(self, target: Target) -> bool:
        """Readiness gate: the session opens in ``prepare``, before the config is swapped in."""
        return target.artifact in self._sessions

    async def ready(self, target: Target) -> bool:
        return self.is_ready(target)

    async def close(self) -> None:
        self._executor.shutdown(wait=False)


def create(settings: Any, artifact_path: Callable[[str], Path]) -> OnnxRuntimeEngine:
    budget_mb = int(getattr(settings, "worker_memory_budget_mb", 0) or 0)
    if budget_mb > 0:  # sessions open on demand, within the budget
        from serving.worker.engines.onnxruntime_budget import BudgetedOnnxRuntimeEngine

        return BudgetedOnnxRuntimeEngine(artifact_path, budget_mb * 1024 * 1024, settings.ort_threads,
                                         settings.resolved_ort_parallel(), wait_s=settings.infer_timeout_s)
    return OnnxRuntimeEngine(artifact_path, settings.ort_threads, settings.resolved_ort_parallel())

