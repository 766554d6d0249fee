"""Which onnxruntime sessions the in-worker engine holds, by model artifact: every one it is given.

The engine (serving/worker/engines/onnxruntime.py) runs inferences; what it runs them on comes
from a holder of sessions. This one opens each model's session when a config is applied (never on
a request) and keeps it while the config uses it. Under a memory budget the engine gets
serving/worker/engines/onnxruntime_budget.py's holder instead, which opens sessions on demand and
closes idle ones to fit: both share the bookkeeping here (sessions by artifact, the retired ones a
request that read the previous config may still use), and the dependency runs one way, from the
engine to the holders and from the budgeted holder to this one.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from serving.ort import session as ort_session
from serving.worker.errors import ModelNotReady
from serving.worker.runtime import Target

RETIRE_AFTER_S = 10.0  # a replaced session outlives the swap: requests that read the old config still use it


class Sessions:
    """One session per model artifact, opened at ``prepare``, dropped RETIRE_AFTER_S after it
    left the config."""

    def __init__(self, artifact_path: Callable[[str], Path], threads: int = 1) -> None:
        self.artifact_path = artifact_path
        self.threads = threads
        self._sessions: dict[str, Any] = {}
        self._retired: dict[str, tuple[Any, float]] = {}  # artifact -> (session, when it left the config)
        self._lock = threading.Lock()

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

    async def acquire(self, target: Target) -> Any:
        """The open session for ``target``, until ``release``: every session opened at ``prepare``."""
        session = self._find(target.artifact)
        if session is None:
            raise ModelNotReady(f"model {target.model}:{target.version} is still loading")
        return session

    def release(self, artifact: str) -> None:
        """The inference that acquired ``artifact``'s session is over."""

    def run(self, artifact: str, session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
        """On the engine's executor."""
        return session.run(names, feeds)

    def _find(self, artifact: str) -> Any:
        """The artifact's session, in the config or retired from it; None when none is open."""
        session = self._sessions.get(artifact)
        return session if session is not None else (self._retired.get(artifact) or (None,))[0]

    def is_ready(self, target: Target) -> bool:
        """Readiness gate: the session opens in ``prepare``, before the config is swapped in."""
        return target.artifact in self._sessions

    def memory(self) -> dict[str, Any]:
        """Open sessions (no budget: nothing is measured)."""
        with self._lock:
            return {"budget_bytes": 0, "sessions": len(self._sessions)}

    def close(self) -> None:
        """Nothing runs here of its own."""
