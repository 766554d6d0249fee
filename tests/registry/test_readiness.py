"""The control plane's readiness book: how worker and Triton reports add up to an endpoint's state
(the reports in the database: SQLite and PostgreSQL)."""
from __future__ import annotations

import pytest

from registry.db import make_engine, session_factory, upgrade
from registry.errors import NotFound
from registry.readiness import EndpointState, ReadinessBook, ReadinessReport


@pytest.fixture
def sessions(database_url):
    engine = make_engine(database_url)
    upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


SNAPSHOT = {"revision": 7, "endpoints": {"w": {"name": "w", "engine": "triton", "targets": [
    {"model": "clf", "version": 3, "weight": 100.0, "role": "stable", "triton_name": "clf_v3"}]}}}


def worker(source: str, revision: int, state: str, error: str | None = None) -> ReadinessReport:
    return ReadinessReport(source=source, revision=revision, endpoints={
        "w": EndpointState(state=state, error=error, serving=[[3, 100.0, "stable"]] if state == "ready" else [])})


def test_ready_only_when_every_live_process_applied_the_revision_and_routes_to_it(sessions):
    clock = Clock()
    book = ReadinessBook(sessions, ttl_s=15, clock=clock)
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "unknown"  # nobody reports
    book.put(worker("worker:a:1", 7, "ready"))
    book.put(worker("worker:a:2", 6, "ready"))  # behind: its "ready" is about revision 6
    status = book.endpoint_status("w", SNAPSHOT)
    assert status["state"] == "pending", status
    assert status["workers"][1]["waiting"] == ["config revision 7 (applied 6)"]
    book.put(worker("worker:a:2", 7, "pending"))
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "pending"
    book.put(worker("worker:a:2", 7, "ready"))
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "ready"
    assert book.summary(SNAPSHOT)["w"] == {"state": "ready", "error": None, "workers": 2, "ready_workers": 2}


def test_a_failure_shows_but_only_for_the_current_revision(sessions):
    book = ReadinessBook(sessions, clock=Clock())
    book.put(worker("worker:a:1", 6, "failed", "RuntimeException: bad graph"))  # an older definition's failure
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "pending"
    book.put(worker("worker:a:1", 7, "failed", "RuntimeException: bad graph"))
    status = book.endpoint_status("w", SNAPSHOT)
    assert status["state"] == "failed" and status["error"] == "RuntimeException: bad graph"


def test_a_triton_load_failure_of_one_of_the_endpoints_models_fails_it(sessions):
    book = ReadinessBook(sessions, clock=Clock())
    book.put(worker("worker:a:1", 7, "pending"))
    book.put(ReadinessReport(source="triton:a:9", kind="triton", revision=7, failures={"other_v1": "x"}))
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "pending"  # not this endpoint's model
    book.put(ReadinessReport(source="triton:a:9", kind="triton", revision=7,
                             failures={"clf_v3": "load failed: NoSuchOperator"}))
    status = book.endpoint_status("w", SNAPSHOT)
    assert status["state"] == "failed"
    assert status["error"] == "Triton could not load clf_v3: load failed: NoSuchOperator"


def test_silent_and_departed_processes_are_forgotten(sessions):
    clock = Clock()
    book = ReadinessBook(sessions, ttl_s=15, clock=clock)
    book.put(worker("worker:a:1", 7, "ready"))
    book.put(worker("worker:a:2", 7, "pending"))
    clock.now += 10
    book.put(worker("worker:a:1", 7, "ready"))
    clock.now += 6  # a:2 silent for 16 s: a process that died without a word
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "ready"
    book.put(ReadinessReport(source="worker:a:1", gone=True))
    assert book.endpoint_status("w", SNAPSHOT)["state"] == "unknown"


def test_unknown_endpoint_is_a_404(sessions):
    with pytest.raises(NotFound):
        ReadinessBook(sessions).endpoint_status("nope", SNAPSHOT)
