"""Console sessions in the database (issue 48): on SQLite and PostgreSQL, two control-plane replicas on one
database share every session (signed in on one, used, flashed and signed out on the other); the table holds
neither the session id nor a readable token; idle sessions end, the last-seen write is throttled, the table is
bounded; migration 0009."""
from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from registry.api import create_app
from registry.console import sessions as console_sessions
from registry.console.sessions import COOKIE, SEEN_WRITE_S, SessionBook
from registry.orm import ConsoleSessionRecord, seconds_of
from serving.settings import ControlPlaneSettings
from tests.registry.migration_check import check_table_migration
from tests.registry.test_readiness import Clock, sessions  # noqa: F401 (one database per test, migrated)
from tests.support.auth import token
from tests.support.postgres import create_database


def test_a_session_acts_only_with_its_csrf_token(sessions):  # noqa: F811
    book = SessionBook(sessions)
    sid = book.open("srv_x", "alice", "viewer")
    session = book.get(sid)
    assert (session.token, session.name, session.role) == ("srv_x", "alice", "viewer")
    assert session.csrf_ok(session.csrf) and not session.csrf_ok("") and not session.csrf_ok(None)
    assert not session.csrf_ok(book.get(book.open("srv_y", "bob", "admin")).csrf)
    assert not session.can_act() and book.get("forged") is None and book.get("x" * 10_000) is None
    assert book.get(sid).csrf == session.csrf  # the same on every read (and every replica): derived from the id
    book.close(sid)
    assert book.get(sid) is None


def test_the_table_holds_no_session_id_and_no_readable_token(sessions):  # noqa: F811
    book = SessionBook(sessions)
    sid = book.open("srv_secret_token_value", "alice", "admin")
    other = book.open("srv_other", "bob", "admin")
    with sessions() as db:
        rows = db.scalars(select(ConsoleSessionRecord)).all()
        stored = " ".join(f"{r.key} {r.sealed} {r.name} {r.role}" for r in rows)
        assert "srv_secret_token_value" not in stored and sid not in stored and book.get(sid).csrf not in stored
        mine = db.get(ConsoleSessionRecord, book.get(sid).key)
        mine.sealed = db.get(ConsoleSessionRecord, book.get(other).key).sealed  # another session's sealed token
        db.commit()
    assert book.get(sid) is None  # it does not open under this id: nobody's session


def test_an_idle_session_ends_and_the_last_seen_write_is_throttled(sessions):  # noqa: F811
    clock = Clock()
    book = SessionBook(sessions, idle_s=600.0, clock=clock)
    sid = book.open("srv_x", "alice", "admin")
    key = book.get(sid).key

    def seen() -> float:
        with sessions() as db:
            return seconds_of(db.get(ConsoleSessionRecord, key).seen_at)

    clock.now += SEEN_WRITE_S / 2
    assert book.get(sid) is not None and seen() == 100.0  # a read, no write
    clock.now += SEEN_WRITE_S
    assert book.get(sid) is not None and seen() == clock.now  # stale enough: rewritten
    clock.now += 599.0
    assert book.get(sid) is not None  # idle 599 s of 600
    clock.now += 601.0
    assert book.get(sid) is None
    with sessions() as db:
        assert db.get(ConsoleSessionRecord, key) is None  # and deleted


def test_a_notice_is_shown_once_by_whichever_book_reads_it(sessions):  # noqa: F811
    a, b = SessionBook(sessions), SessionBook(sessions)
    sid = a.open("srv_x", "alice", "admin")
    a.set_notice(a.get(sid), {"text": "done", "ok": True})
    assert b.take_notice(b.get(sid)) == {"text": "done", "ok": True}
    assert a.get(sid).notice is None and a.take_notice(a.get(sid)) is None


def test_the_table_is_bounded_least_recently_seen_first(sessions, monkeypatch):  # noqa: F811
    monkeypatch.setattr(console_sessions, "MAX_SESSIONS", 3)
    clock = Clock()
    book = SessionBook(sessions, clock=clock)
    sids = []
    for i in range(5):
        clock.now += 1
        sids.append(book.open(f"srv_{i}", f"u{i}", "viewer"))
    assert [book.get(s) is not None for s in sids] == [False, False, True, True, True]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page[:500]
    return found.group(1)


@pytest.fixture
def replicas(database_url: str, tmp_path: Path):
    """Replicas A and B: two control planes on one database and one home (the same bootstrap tokens)."""
    home = tmp_path / "home"
    settings = ControlPlaneSettings(home=home, database_url=database_url)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        yield a, b, token(home)


def test_a_session_signed_in_on_one_replica_is_used_and_ended_on_the_other(replicas):
    a, b, admin = replicas
    signed = a.post("/console/signin", data={"token": admin}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    cookie = {"Cookie": f"{COOKIE}={signed.cookies[COOKIE]}"}
    assert admin not in signed.headers["set-cookie"]

    page = b.get("/console/keys", headers=cookie, follow_redirects=False)  # the other replica knows it
    assert page.status_code == 200 and "bootstrap-admin" in page.text, page.text[:500]
    csrf = csrf_of(page.text)
    made = b.post("/console/keys/create", headers=cookie, data={"csrf": csrf, "kind": "key", "name": "k1"})
    assert made.status_code == 200 and "k1" in made.text, made.text[:500]
    revoked = a.post("/console/keys/revoke", headers=cookie, follow_redirects=False,
                     data={"csrf": csrf, "kind": "key", "name": "k1", "confirm": "yes"})
    assert revoked.status_code == 303, revoked.text
    assert [k["revoked"] for k in b.get("/client-keys", headers={"Authorization": f"Bearer {admin}"}).json()
            if k["name"] == "k1"] == [True]
    assert 'id="flash">revoked key k1<' in b.get("/console/keys", headers=cookie).text  # flashed on A, shown on B
    assert 'id="flash"' not in a.get("/console/keys", headers=cookie).text  # once

    assert b.post("/console/signout", headers=cookie, data={"csrf": "forged"}).status_code == 403
    assert b.post("/console/signout", headers=cookie, data={"csrf": csrf}, follow_redirects=False).status_code == 303
    gone = a.get("/console/keys", headers=cookie, follow_redirects=False)
    assert gone.status_code in (302, 303, 307) and gone.headers["location"].endswith("/console/signin")


def test_migration_0009_on_sqlite_and_postgresql(database_url):
    check_table_migration(database_url, "0008", "0009", "console_sessions",
                          {"key", "sealed", "name", "role", "notice", "opened_at", "seen_at"}, ["key"])


def test_a_page_says_the_database_is_unavailable_and_works_again_when_it_is_back(postgres_admin_url, tmp_path):
    """A real outage of the database that keeps sessions: connections refused and the open ones ended. A page is
    then a 503 naming the cause (never a 500), and once the database takes connections the same cookie works."""
    url = create_database(postgres_admin_url, "registry_outage")
    home = tmp_path / "home"
    admin_conn = psycopg.connect(postgres_admin_url.replace("+psycopg", ""), autocommit=True)

    def allow(yes: bool) -> None:
        admin_conn.execute(f'ALTER DATABASE "registry_outage" ALLOW_CONNECTIONS {str(yes).lower()}')
        if not yes:
            admin_conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = 'registry_outage' AND pid <> pg_backend_pid()")

    with admin_conn, TestClient(create_app(ControlPlaneSettings(home=home, database_url=url))) as app:
        signed = app.post("/console/signin", data={"token": token(home)}, follow_redirects=False)
        cookie = {"Cookie": f"{COOKIE}={signed.cookies[COOKIE]}", "Accept": "text/html"}
        assert app.get("/console/keys", headers=cookie).status_code == 200
        allow(False)
        try:
            down = app.get("/console/keys", headers=cookie, follow_redirects=False)
            assert down.status_code == 503 and down.headers["retry-after"] == "1", down.text[:500]
            assert "registry database is busy or unreachable" in down.text and "Traceback" not in down.text
        finally:
            allow(True)
        back = app.get("/console/keys", headers=cookie, follow_redirects=False)
        assert back.status_code == 200 and "bootstrap-admin" in back.text, back.text[:500]  # still signed in


def test_an_upload_is_checked_for_the_cookie_before_its_body_and_for_the_csrf_token_after(replicas):
    """The multipart form reads the session once: the cookie before the body is read, the CSRF token from the
    fields after (tests/registry/console/test_console_browser.py sends a real upload to a real handler)."""
    a, b, admin = replicas
    signed = a.post("/console/signin", data={"token": admin}, follow_redirects=False)
    cookie = {"Cookie": f"{COOKIE}={signed.cookies[COOKIE]}"}
    csrf = csrf_of(b.get("/console/keys", headers=cookie).text)
    url, files = "/console/playground/upload?endpoint=nope", {"file": ("x.png", b"\x89PNG", "image/png")}
    assert b.post(url, files=files, data={"csrf": csrf}).status_code == 403  # no session
    for form in ({}, {"csrf": "guessed"}):
        assert b.post(url, files=files, data=form, headers=cookie).status_code == 403
    taken = b.post(url, files=files, data={"csrf": csrf}, headers=cookie)
    assert taken.status_code != 403 and "CSRF" not in taken.text, taken.text[:500]
