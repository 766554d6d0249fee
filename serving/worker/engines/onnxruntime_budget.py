"""The onnxruntime sessions the in-worker engine holds under a memory budget
(``SERVING_WORKER_MEMORY_BUDGET_MB``).

Without a budget every session opens when a config is applied
(serving/worker/engines/onnxruntime_sessions.py). With one, many models fit one worker: a session
opens on the first request for its model, and when it would not fit, the least recently used idle
sessions are closed first (serving/worker/engines/session_budget.py decides). The engine
(serving/worker/engines/onnxruntime.py) runs inferences on what this holder gives it.

* Admission (``prepare``, the readiness gate): the model is opened once, which checks that
  onnxruntime can load it (a corrupt version fails the gate and the old routes keep answering, as
  without a budget) and measures what it holds; it stays open only while it fits beside the open
  ones, else it is closed again and is "cold but loadable": ready for the gate.
* A request that finds its model cold waits for it to open (on a loader thread, never on the event
  loop; concurrent requests for it wait for the same one load), then runs: a cold model costs its
  load time, not an error.
* When busy sessions (an inference running or queued on them, or used within ``IDLE_S``) hold the
  room, the load waits for one to become idle, up to ``SERVING_INFER_TIMEOUT_S``, then the request
  is answered 503 with ``Retry-After``; it never loads past the budget for it, since the budget is
  there to keep the process from running the machine out of memory. A model larger than the whole
  budget opens alone, once every other session is idle and closed, with a warning.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from serving.worker.engines.onnxruntime_sessions import Sessions
from serving.worker.engines.session_budget import MB, SessionBudget, release_freed, resident_bytes
from serving.worker.errors import ModelNotReady, Unavailable, brief
from serving.worker.runtime import Target

log = logging.getLogger(__name__)

LOAD_ATTEMPTS = 3  # a session closed again before its waiting request reached it is reopened this often
POLL_S = 0.05      # while busy sessions hold the room: how often their recency guard is looked at again


def _label(target: Target) -> str:
    return f"{target.model}:{target.version}"


def warm_up_onnxruntime() -> None:
    """Open and drop a one-node model, so that onnxruntime's process-wide set-up (kernel registries,
    about 9.5 MB measured) is not charged to the first real session as its own cost."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from serving.ort import providers

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y"))
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "warm_up", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ort.InferenceSession(model.SerializeToString(), providers=providers())


class BudgetedSessions(Sessions):
    """Sessions opened on demand and closed least recently used first, within ``budget_bytes``."""

    def __init__(self, artifact_path: Callable[[str], Path], budget_bytes: int, threads: int = 1,
                 wait_s: float = 30.0) -> None:
        super().__init__(artifact_path, threads)
        self.budget = SessionBudget(budget_bytes)
        self.wait_s = wait_s
        self._room = threading.Condition(self._lock)  # notified whenever an inference ends
        self._open_lock = threading.Lock()  # one session opens at a time: the RSS it adds is its own
        self._loads: dict[str, Future] = {}  # artifact -> its load under way, shared by its waiters
        self._unmeasured: set[str] = set()  # opened, not run yet: its first run is measured
        self._labels: dict[str, str] = {}
        self._warm = False  # onnxruntime's own set-up done, before the first measure
        self._activity = 0  # inferences begun and sessions opened: a measure spanning one is discarded
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxruntime-load")

    # --- admission: the readiness gate ------------------------------------------------------
    def prepare(self, target: Target) -> None:
        """Readiness gate, on the config's path: a version is checked (opened) once; a session
        retired from the previous config comes back."""
        artifact = target.artifact
        with self._lock:
            self._labels.setdefault(artifact, _label(target))
            retired = self._retired.pop(artifact, None) if artifact not in self._sessions else None
            if retired is not None:
                self._sessions[artifact] = retired[0]
            if artifact in self._sessions or self.budget.loadable(artifact):
                return
        self._admit(artifact)

    def _admit(self, artifact: str) -> None:
        """Open once (raises when onnxruntime cannot), measure, keep it open only if it fits."""
        try:
            size = self.artifact_path(artifact).stat().st_size
            with self._lock:
                self.budget.admit(artifact, size)
            with self._open_lock:
                session, measured = self._open(artifact)
        except Exception as exc:
            with self._lock:
                self.budget.failed(artifact, brief(exc))
            raise
        with self._lock:
            keep = self.budget.admitted(artifact, measured)
            if keep:
                self._sessions[artifact] = session
                self._unmeasured.add(artifact)
            cost = self.budget.cost(artifact)
        del session
        if not keep:
            release_freed()
        log.info("%s loads (%.1f MB); %s", self._labels.get(artifact, artifact), cost / MB,
                 "kept open" if keep else "closed until its first request: the budget is full")

    def is_ready(self, target: Target) -> bool:
        """Open, or known to open: a cold model is ready (its first request waits for the load)."""
        with self._lock:
            return target.artifact in self._sessions or self.budget.loadable(target.artifact)

    # --- requests -----------------------------------------------------------------------------
    async def acquire(self, target: Target) -> Any:
        """The open session, opened first when cold; counted busy until ``release``."""
        for _ in range(LOAD_ATTEMPTS):
            session = self.take(target.artifact)
            if session is not None:
                return session
            # shielded: one waiter cancelled (its client gone) must not cancel the others' load
            await asyncio.shield(asyncio.wrap_future(self._load_once(target)))
        raise Unavailable(f"model {_label(target)} was closed again before it could run: the worker's memory "
                          f"budget ({self.budget.limit / MB:.0f} MB) is too small for the models in use")

    def take(self, artifact: str) -> Any:
        """The open session of ``artifact``, counted busy until ``release``; None when it is cold."""
        with self._lock:
            session = self._find(artifact)
            if session is not None:
                self.budget.begin(artifact, time.time())
                self._activity += 1
            return session

    def release(self, artifact: str) -> None:
        with self._room:
            self.budget.end(artifact, time.time())
            self._room.notify_all()

    def run(self, artifact: str, session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
        """Run; a session's first run alone in the process is measured (onnxruntime allocates as
        it runs). Runs beside other inferences or a load are not, and a measure that another one
        began during is dropped: their allocations would read as this session's. Its next run
        tries again."""
        if artifact not in self._unmeasured:
            return session.run(names, feeds)
        with self._lock:
            quiet = self.budget.running() == 1 and not self._open_lock.locked()
            mark = self._activity
        if not quiet:
            return session.run(names, feeds)
        before = resident_bytes()
        values = session.run(names, feeds)
        grew = resident_bytes() - before
        with self._lock:
            if mark == self._activity and artifact in self._unmeasured:
                self._unmeasured.discard(artifact)
                self.budget.ran_first(artifact, grew)
        return values

    # --- loading on demand ----------------------------------------------------------------------
    def _load_once(self, target: Target) -> Future:
        """The load of ``target`` under way, started when there is none."""
        with self._lock:
            future = self._loads.get(target.artifact)
            if future is None:
                if not self.budget.loadable(target.artifact):
                    raise ModelNotReady(f"model {_label(target)} is still loading")
                future = self._loader.submit(self._load_for_request, target)
                self._loads[target.artifact] = future
            return future

    def _load_for_request(self, target: Target) -> None:
        """On the loader thread: make room, then open."""
        try:
            with self._lock:
                if target.artifact in self._sessions:
                    return
            self._make_room(target)
            self._open_reserved(target)
        finally:
            with self._lock:
                self._loads.pop(target.artifact, None)

    def _make_room(self, target: Target) -> None:
        """Close least recently used idle sessions until ``target`` fits, waiting while busy ones
        hold the room; then reserve the room for it. Unavailable (503) past ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        with self._room:
            while (victims := self.budget.room_for(target.artifact, time.time())) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"model {_label(target)} cannot load now: the worker's memory budget "
                                      f"({self.budget.limit / MB:.0f} MB) is held by models busy answering")
                self._room.wait(min(left, POLL_S))
            closed = self._close(victims)
            self.budget.reserve(target.artifact)
            cost = self.budget.cost(target.artifact)
        if cost > self.budget.limit:
            log.warning("%s needs %.1f MB, more than the worker's whole memory budget (%.0f MB): loading it alone",
                        _label(target), cost / MB, self.budget.limit / MB)
        self._free(closed, f"to make room for {_label(target)}")

    def _close(self, victims: Iterable[str]) -> list[tuple[str, int, Any]]:
        """Under the lock: take the sessions out; (artifact, bytes it was charged, session) each."""
        closed = []
        for victim in victims:
            closed.append((victim, self.budget.closed(victim), self._find(victim)))
            self._sessions.pop(victim, None)
            self._retired.pop(victim, None)
        return closed

    def _free(self, closed: list[tuple[str, int, Any]], why: str) -> None:
        """Outside the lock: drop the last references to closed sessions (onnxruntime frees them
        here) and give their memory back to the system."""
        for victim, held, _ in closed:
            log.info("closed %s (%.1f MB) %s", self._labels.get(victim, victim), held / MB, why)
        if closed:
            closed.clear()
            release_freed()

    def _open_reserved(self, target: Target) -> None:
        artifact, t0 = target.artifact, time.monotonic()
        try:
            with self._open_lock:
                session, measured = self._open(artifact)
        except Exception as exc:
            with self._lock:
                self.budget.unreserve(artifact)
            log.warning("%s could not be loaded: %s", _label(target), brief(exc))
            raise Unavailable(f"model {_label(target)} could not be loaded: {brief(exc)}") from None
        with self._lock:
            self._sessions[artifact] = session
            self.budget.opened(artifact, measured, time.time())  # used now: its waiters take it next
            self._unmeasured.add(artifact)
            closed = self._close(self.budget.refit(artifact, time.time()))
            cost, (count, used) = self.budget.cost(artifact), self.budget.held()
        del session
        self._free(closed, f"as {_label(target)} measured {cost / MB:.1f} MB, more than its estimate")
        log.info("loaded %s on demand (%.1f MB, %.3fs; %d sessions, %.0f of %.0f MB)", _label(target),
                 cost / MB, time.monotonic() - t0, count, used / MB, self.budget.limit / MB)

    def _open(self, artifact: str) -> tuple[Any, int]:
        """A new session and the resident bytes it added (freed heap returned before and after).
        Under ``_open_lock``."""
        if not self._warm:
            warm_up_onnxruntime()
            self._warm = True
        with self._lock:
            self._activity += 1
        release_freed()
        before = resident_bytes()
        session = self._load(artifact)
        release_freed()
        return session, max(0, resident_bytes() - before)

    # --- config changes and status ----------------------------------------------------------------
    def retain(self, targets: Iterable[Target]) -> None:
        """As without a budget; models that left the config are forgotten once their session is gone
        (a version added back is admitted again)."""
        targets = list(targets)
        keep = {t.artifact for t in targets}
        with self._lock:
            before = len(self._sessions) + len(self._retired)
        super().retain(targets)
        with self._lock:
            held = set(self._sessions) | set(self._retired) | set(self._loads)
            dropped = before > len(self._sessions) + len(self._retired)
            for artifact in [a for a in self.budget.models if a not in keep and a not in held]:
                self.budget.forget(artifact)
                self._labels.pop(artifact, None)
                self._unmeasured.discard(artifact)
        if dropped:
            release_freed()

    def memory(self) -> dict[str, Any]:
        """Open sessions and the bytes charged for them, against the budget."""
        with self._lock:
            count, used = self.budget.held()
            return {"budget_bytes": self.budget.limit, "sessions": count, "bytes": used}

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
