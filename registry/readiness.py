"""Where each deployed version answers: the readiness reports of worker processes and Triton.

Workers route to a new version only once it is ready on their engine (serving/worker/gate.py)
and report, per process, the config revision they applied and each endpoint's state
(serving/readiness_report.py). The embedded Triton reports the models it failed to load. The
reports live in the database (table ``readiness_reports``, one row a source), so every control-plane
replica answers from all of them, whichever replica a report reached; a process silent for ``TTL_S``
is forgotten, and one that stops says so. The time a report was received is the receiving replica's
UTC clock (replicas' clocks agree to far less than the TTL).

An endpoint is ``ready`` when every live worker process applied the current revision and routes
to its current targets; ``failed`` when one of them could not build it or Triton could not load
one of its models (the old routes keep answering meanwhile); ``pending`` otherwise; ``unknown``
when no worker reports at all.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from registry.errors import NotFound
from registry.orm import ReadinessRecord, seconds_of, stamp
from serving.llm.naming import LLM_ENGINES, adapter_name, lora_base, target_engine

TTL_S = 15.0          # three missed heartbeats (serving/readiness_report.py HEARTBEAT_S)
MAX_SOURCES = 1000    # bound on the reports kept and read: the oldest report goes first
PRUNE_S = 5.0         # how often (at most) a replica deletes the reports older than the TTL
MAX_WAIT_S = 60.0     # one long poll; the CLI polls again for longer waits
POLL_S = 0.1


class EndpointState(BaseModel):
    state: Literal["ready", "pending", "failed"]
    error: str | None = Field(None, max_length=2000)
    serving: list[list[Any]] = Field(default_factory=list, max_length=64)  # [version, weight, role]
    waiting: list[str] = Field(default_factory=list, max_length=64)
    pending_s: float | None = None


class EngineState(BaseModel):
    """An LLM engine the launcher runs, as the console shows it (scale to zero: serving/llm/kube/idle.py)."""

    state: Literal["ready", "starting", "failed", "scaled_to_zero"]
    waking: bool = False
    replicas: int = Field(0, ge=0)
    scale_to_zero_after_s: int | None = None
    cold_start_s: float | None = None


class ReadinessReport(BaseModel):
    source: str = Field(min_length=1, max_length=200)
    kind: Literal["worker", "triton", "llm"] = "worker"
    gone: bool = False
    revision: int = -1
    endpoints: dict[str, EndpointState] = Field(default_factory=dict)  # workers
    failures: dict[str, str] = Field(default_factory=dict)  # triton / llm: model name -> why its load failed
    engines: dict[str, EngineState] = Field(default_factory=dict, max_length=1000)  # llm: by engine key


class ReadinessBook:
    """The reports, in the database every replica shares. ``clock``: seconds since the epoch (a test's
    clock may start anywhere); it stamps the reports received here and ages the ones read."""

    def __init__(self, sessions: sessionmaker, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions, self.ttl_s, self.clock = sessions, ttl_s, clock
        self._pruned_at = float("-inf")

    def put(self, report: ReadinessReport) -> None:
        with self.sessions.begin() as session:
            if report.gone:
                session.execute(delete(ReadinessRecord).where(ReadinessRecord.source == report.source))
                return
            _upsert(session, {"source": report.source, "kind": report.kind, "revision": report.revision,
                              "report": report.model_dump(mode="json"), "received_at": stamp(self.clock())})

    def live(self) -> list[tuple[float, ReadinessReport]]:
        """The reports of processes heard from within ``ttl_s`` (at most ``MAX_SOURCES``, the newest), by
        source; one SELECT. Now and then (every ``PRUNE_S``) the older ones are deleted too."""
        now = self.clock()
        if now - self._pruned_at >= PRUNE_S:
            self._prune(now)
        query = (select(ReadinessRecord.received_at, ReadinessRecord.report)
                 .where(ReadinessRecord.received_at >= stamp(now - self.ttl_s))
                 .order_by(ReadinessRecord.received_at.desc()).limit(MAX_SOURCES))
        with self.sessions() as session:
            rows = session.execute(query).all()
        found = [(seconds_of(at), ReadinessReport.model_validate(report)) for at, report in rows]
        return sorted(found, key=lambda entry: entry[1].source)

    def _prune(self, now: float) -> None:
        """Delete the reports older than the TTL, and the oldest beyond ``MAX_SOURCES``."""
        self._pruned_at = now
        with self.sessions.begin() as session:
            session.execute(delete(ReadinessRecord).where(ReadinessRecord.received_at < stamp(now - self.ttl_s)))
            if session.scalar(select(func.count()).select_from(ReadinessRecord)) > MAX_SOURCES:
                kept = (select(ReadinessRecord.source).order_by(ReadinessRecord.received_at.desc())
                        .limit(MAX_SOURCES).scalar_subquery())
                session.execute(delete(ReadinessRecord).where(ReadinessRecord.source.not_in(kept)))

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


def _upsert(session: Session, values: dict[str, Any]) -> None:
    """Insert the source's row or replace it, in one statement (two replicas may write one source at once)."""
    dialect = {"postgresql": postgresql, "sqlite": sqlite}.get(session.get_bind().dialect.name)
    if dialect is None:  # another database: replace it within the transaction
        session.execute(delete(ReadinessRecord).where(ReadinessRecord.source == values["source"]))
        session.add(ReadinessRecord(**values))
        return
    insert = dialect.insert(ReadinessRecord).values(**values)
    session.execute(insert.on_conflict_do_update(
        index_elements=[ReadinessRecord.source],
        set_={name: insert.excluded[name] for name in values if name != "source"}))


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
        while True:  # one SELECT a poll, off the event loop
            status = await run_in_threadpool(book.endpoint_status, name, snapshot())
            if status["state"] in ("ready", "failed") or time.monotonic() >= deadline:
                return status
            await asyncio.sleep(POLL_S)

    return router
