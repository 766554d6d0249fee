"""Two control-plane replicas on one database (SQLite and PostgreSQL) answer from the same readiness
reports, whichever of them a report reached (issue 48): listed, counted in an endpoint's state (and its
long poll), forgotten after the TTL, removed by a ``gone`` report; the table's bound; migration 0008."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from registry import readiness
from registry.api import create_app
from registry.orm import ReadinessRecord
from registry.readiness import ReadinessBook, ReadinessReport
from serving.settings import ControlPlaneSettings
from tests.registry.migration_check import check_table_migration
from tests.registry.test_api import add_model, tiny_onnx
from tests.support.auth import headers
from tests.registry.test_readiness import sessions  # noqa: F401 (one database per test, migrated)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Plane:
    """One control-plane replica, driven as a reader (admin token) and as a worker (worker token)."""

    def __init__(self, client: TestClient, home: Path) -> None:
        self.client, self.worker = client, headers(home, "worker")
        client.headers.update(headers(home))

    @property
    def book(self) -> ReadinessBook:
        return self.client.app.state.readiness

    def report(self, source: str, state: str | None = None, gone: bool = False) -> None:
        """A worker process's report (serving/readiness_report.py) for the current revision."""
        body: dict = {"source": source, "kind": "worker", "gone": gone}
        if state is not None:
            body.update(revision=self.client.get("/config").json()["revision"], endpoints={"e": {
                "state": state, "serving": [[1, 100.0, "stable"]] if state == "ready" else [], "waiting": []}})
        answer = self.client.post("/readiness", json=body, headers=self.worker)
        assert answer.status_code == 204, answer.text

    def sources(self) -> list[str]:
        answer = self.client.get("/readiness")
        assert answer.status_code == 200, answer.text
        return [r["source"] for r in answer.json()]

    def status(self, **params) -> dict:
        answer = self.client.get("/endpoints/e/status", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture
def planes(database_url: str, tmp_path: Path):
    """Replicas A and B: two apps on one database (and one home: one pair of bootstrap tokens, as replicas
    given the same SERVING_*_TOKEN have), and the endpoint ``e`` made through B."""
    home = tmp_path / "home"
    settings = ControlPlaneSettings(home=home, database_url=database_url)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        a_plane, b_plane = Plane(a, home), Plane(b, home)
        sha = b.post("/artifacts", content=tiny_onnx(tmp_path / "m.onnx").read_bytes()).json()["sha256"]
        add_model(b, "clf", sha)
        assert b.post("/endpoints", json={"endpoint": "e", "model": "clf"}).status_code == 201
        revision, deadline = b.get("/config").json()["revision"], time.monotonic() + 15
        while a.get("/config").json()["revision"] != revision:  # A reads the change from the database (1 s)
            assert time.monotonic() < deadline, "replica A never saw the endpoint made through B"
            time.sleep(0.1)
        yield a_plane, b_plane


def rows(plane: Plane) -> int:
    with plane.book.sessions() as session:
        return session.scalar(select(func.count()).select_from(ReadinessRecord))


def test_a_report_to_one_replica_is_seen_and_counted_by_the_other(planes):
    a, b = planes
    assert b.status()["state"] == "unknown"
    a.report("worker:x:1", "ready")
    assert b.sources() == ["worker:x:1"]
    assert [(w["source"], w["state"]) for w in b.status()["workers"]] == [("worker:x:1", "ready")]
    assert b.status()["state"] == "ready"
    b.report("worker:x:2", "pending")  # the second worker's heartbeat reached B: A counts it too
    assert a.sources() == ["worker:x:1", "worker:x:2"] == b.sources()
    assert a.status()["state"] == "pending" == b.status()["state"]
    listed = {e["name"]: e["readiness"] for e in b.client.get("/endpoints").json()}
    assert listed["e"] == {"state": "pending", "error": None, "workers": 2, "ready_workers": 1}

    # B's long poll (`serving model add --wait`) ends when the report that makes it ready reaches A
    answers: list[dict] = []
    waiting = threading.Thread(target=lambda: answers.append(b.status(wait=30)))
    started = time.monotonic()
    waiting.start()
    time.sleep(0.5)
    a.report("worker:x:2", "ready")
    waiting.join(timeout=30)
    assert answers and answers[0]["state"] == "ready", answers
    assert time.monotonic() - started < 10, "the long poll saw the report long after it came"
    assert [w["state"] for w in answers[0]["workers"]] == ["ready", "ready"]


def test_a_report_older_than_the_ttl_is_gone_on_both_and_deleted(planes):
    a, b = planes
    clock = Clock(time.time())
    a.book.clock = b.book.clock = clock  # one clock for both, as NTP-synchronized replicas have
    a.report("worker:x:1", "ready")
    clock.now += 10
    b.report("worker:x:2", "ready")
    assert a.sources() == ["worker:x:1", "worker:x:2"] == b.sources()
    assert [r["age_s"] for r in b.client.get("/readiness").json()] == [10.0, 0.0]
    clock.now += readiness.TTL_S - 5  # x:1 silent for 20 s, x:2 for 10 s
    assert a.sources() == ["worker:x:2"] == b.sources()
    assert rows(a) == 1, "the expired report is deleted once a replica prunes"
    clock.now += 10
    assert a.status()["state"] == "unknown" == b.status()["state"]
    assert a.sources() == [] == b.sources() and rows(b) == 0


def test_a_gone_report_through_one_replica_removes_it_from_the_others_view(planes):
    a, b = planes
    a.report("worker:x:1", "ready")
    a.report("worker:x:2", "ready")
    assert a.status()["state"] == "ready"
    b.report("worker:x:1", gone=True)  # the stopping worker's last word reached B
    assert a.sources() == ["worker:x:2"] == b.sources()
    b.report("worker:x:2", gone=True)
    assert a.status()["state"] == "unknown" and a.sources() == [] and rows(a) == 0
    b.report("worker:x:3", gone=True)  # a source never heard of: nothing to remove
    assert a.sources() == []


def test_one_row_a_source_when_replicas_write_it_at_once(sessions):  # noqa: F811
    books = [ReadinessBook(sessions), ReadinessBook(sessions)]

    def heartbeats(book: ReadinessBook) -> None:
        for revision in range(40):
            book.put(ReadinessReport(source="worker:x:1", revision=revision))

    threads = [threading.Thread(target=heartbeats, args=(book,)) for book in books]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(r.source, r.revision) for _, r in books[1].live()] == [("worker:x:1", 39)]


def test_the_table_is_bounded_the_oldest_going_first(sessions, monkeypatch):  # noqa: F811
    monkeypatch.setattr(readiness, "MAX_SOURCES", 3)
    clock = Clock(1000.0)
    book = ReadinessBook(sessions, clock=clock)
    for n in range(5):
        clock.now += 1
        book.put(ReadinessReport(source=f"worker:x:{n}"))
    assert [r.source for _, r in book.live()] == ["worker:x:2", "worker:x:3", "worker:x:4"]
    with sessions() as session:
        assert session.scalars(select(ReadinessRecord.source).order_by(ReadinessRecord.source)).all() == [
            "worker:x:2", "worker:x:3", "worker:x:4"]


def test_migration_0008_on_sqlite_and_postgresql(database_url):
    check_table_migration(database_url, "0007", "0008", "readiness_reports",
                          {"source", "kind", "revision", "report", "received_at"}, ["source"])
