"""Where each deployed version answers: the readiness reports of worker processes and Triton.

Workers route to a new version only once it is ready on their engine (serving/worker/gate.py)
and report, per process, the config revision they applied and each endpoint's state
(serving/readiness_report.py). The embedded Triton reports the models it failed to load. The
reports live in this process's memory only (a restarted control plane knows again within one
heartbeat); a process silent for ``TTL_S`` is forgotten, and one that stops says so.

An endpoint is ``ready`` when every live worker process applied the current revision and routes
to its current targets; ``failed`` when one of them could not build it or Triton could not load
one of its models (the old routes keep answering meanwhile); ``pending`` otherwise; ``unknown``
when no worker reports at all.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from registry.errors import NotFound
from serving.llm.naming import LLM_ENGINES, adapter_name, lora_base, target_engine

TTL_S = 15.0          # three missed heartbeats (serving/readiness_report.py HEARTBEAT_S)
MAX_SOURCES = 1000    # memory bound: the oldest report goes first
MAX_WAIT_S = 60.0     # one long poll; the CLI polls again for longer waits
POLL_S = 0.1


class EndpointState(BaseModel):
    state: Literal["ready", "pending", "failed"]
    error: str | None = Field(None, max_length=2000)
    serving: list[list[Any]] = Field(default_factory=list, max_length=64)  # [version, weight, role]
    waiting: list[str] = Field(default_factory=list, max_length=64)
    pending_s: float | None = None


class ReadinessReport(BaseModel):
    source: str = Field(min_length=1, max_length=200)
    kind: Literal["worker", "triton", "llm"] = "worker"
    gone: bool = False
    revision: int = -1
    endpoints: dict[str, EndpointState] = Field(default_factory=dict)  # workers
    failures: dict[str, str] = Field(default_factory=dict)  # triton / llm: model name -> why its load failed


class ReadinessBook:
    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._reports: dict[str, tuple[float, ReadinessReport]] = {}
        self._lock = threading.Lock()

    def put(self, report: ReadinessReport) -> None:
        with self._lock:
            self._reports.pop(report.source, None)
            if not report.gone:
                self._reports[report.source] = (self.clock(), report)
                while len(self._reports) > MAX_SOURCES:
                    del self._reports[next(iter(self._reports))]

    def live(self) -> list[tuple[float, ReadinessReport]]:
        """The reports of processes heard from within ``ttl_s`` (the others are forgotten now)."""
        now = self.clock()
        with self._lock:
            for source in [s for s, (at, _) in self._reports.items() if now - at > self.ttl_s]:
                del self._reports[source]
            return list(self._reports.values())

    def endpoint_status(self, name: str, snapshot: dict) -> dict[str, Any]:
        spec = (snapshot.get("endpoints") or {}).get(name)
        if spec is None:
            raise NotFound(f"endpoint {name!r} not found")
        return self._status(name, spec, int(snapshot.get("revision", -1)), self.live())

    def summary(self, snapshot: dict) -> dict[str, dict[str, Any]]:
        """Each endpoint's state and error, for `serving endpoint list` (the reports read once)."""
        revision, reports = int(snapshot.get("revision", -1)), self.live()
        out = {}
        for name, spec in (snapshot.get("endpoints") or {}).items():
            status = self._status(name, spec, revision, reports)
            out[name] = {"state": status["state"], "error": status["error"],
                         "workers": len(status["workers"]),
                         "ready_workers": sum(w["state"] == "ready" for w in status["workers"])}
        return out

    def _status(self, name: str, spec: dict, revision: int,
                reports: list[tuple[float, ReadinessReport]]) -> dict[str, Any]:
        now = self.clock()
        workers = [_worker_line(r, name, revision, now - at) for at, r in reports if r.kind == "worker"]
        errors = [w["error"] for w in workers if w["state"] == "failed"] + _engine_failures(spec, reports)
        if errors:
            state = "failed"
        elif not workers:
            state = "unknown"
        else:
            state = "ready" if all(w["state"] == "ready" for w in workers) else "pending"
        wanted = [[t["version"], t.get("weight", 0), t.get("role", "stable")] for t in spec.get("targets") or []]
        return {"endpoint": name, "revision": revision, "state": state, "error": errors[0] if errors else None,
                "targets": wanted, "workers": workers}


def _worker_line(report: ReadinessReport, name: str, revision: int, age_s: float) -> dict[str, Any]:
    entry = report.endpoints.get(name)
    line: dict[str, Any] = {"source": report.source, "revision": report.revision, "age_s": round(age_s, 1),
                            "state": "pending", "error": None, "serving": [], "waiting": []}
    if entry is not None:
        line.update(serving=entry.serving, waiting=entry.waiting, pending_s=entry.pending_s)
        if report.revision >= revision:  # an older revision's state says nothing about this one
            line.update(state=entry.state, error=entry.error)
    if report.revision < revision:
        line["waiting"] = [f"config revision {revision} (applied {report.revision})"]
    return line


# a report kind whose failures concern an engine's endpoints: (engine, a target's name there, message);
# the launcher names an engine by version and options (serving/llm/naming.py), as the endpoint's are
FAILURE_REPORTS = {
    "triton": (("triton",), lambda spec, t: {t.get("triton_name")}, "Triton could not load {model}: {why}"),
    "llm": (LLM_ENGINES, lambda spec, t: {target_engine(str(t.get("model")), t.get("version"), t.get("signature"),
                                                   spec.get("engine_options")),
                                     *([adapter_name(str(t.get("model")), t.get("version"))]
                                       if lora_base(t.get("signature")) else [])},
            "vLLM engine of {model} failed: {why}"),
}


def _engine_failures(spec: dict, reports: list[tuple[float, ReadinessReport]]) -> list[str]:
    """Failures the embedded Triton or the LLM launcher (serving/llm/launch/launcher.py) report for this endpoint."""
    out = []
    for kind, (engines, target_name, message) in FAILURE_REPORTS.items():
        if spec.get("engine", "triton") not in engines:
            continue
        names = {name for t in spec.get("targets") or [] for name in target_name(spec, t)}
        out += [message.format(model=model, why=why) for _, r in reports if r.kind == kind
                for model, why in sorted(r.failures.items()) if model in names]
    return out


def readiness_router(book: ReadinessBook, snapshot: Callable[[], dict]) -> APIRouter:
    router = APIRouter()

    @router.post("/readiness", status_code=204)
    def report(body: ReadinessReport) -> None:
        book.put(body)

    @router.get("/readiness")
    def reports() -> list[dict]:
        now = book.clock()
        return [{**r.model_dump(), "age_s": round(now - at, 1)} for at, r in book.live()]

    @router.get("/endpoints/{name:path}/status")  # names may hold "/" (sent as %2F)
    async def endpoint_status(name: str, wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)) -> dict:
        """``wait``: hold the answer up to that many seconds until the state is ready or failed."""
        deadline = time.monotonic() + wait
        while True:
            status = book.endpoint_status(name, snapshot())
            if status["state"] in ("ready", "failed") or time.monotonic() >= deadline:
                return status
            await asyncio.sleep(POLL_S)

    return router
