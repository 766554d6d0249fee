"""Config changes announced between control-plane replicas with PostgreSQL's LISTEN/NOTIFY.

Every change the registry commits bumps the config revision (registry/service.py); on PostgreSQL the
same transaction sends ``NOTIFY serving_config`` with the new revision, which the server delivers
to every listening session when, and only if, the transaction commits. Each replica listens on a
connection of its own and rebuilds its snapshot on each notification, so workers streaming from
any replica get a change made through another within milliseconds rather than at the next poll.

A notification sent while a listener is reconnecting is lost: a listener refreshes once each time it
(re)connects, and the broadcaster's slow poll (``SAFETY_NET_POLL_S``) stays as a last resort.
On SQLite (one machine, one process in practice) there is no listener: the 1 s poll remains.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from sqlalchemy import make_url, text
from sqlalchemy.orm import Session

from registry.db import dedicated_connection

log = logging.getLogger(__name__)

CHANNEL = "serving_config"
SAFETY_NET_POLL_S = 30.0  # the broadcaster's database poll while a listener runs
NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', revision::text) FROM config_state WHERE id = 1")


def uses_notify(database_url: str) -> bool:
    return make_url(database_url).get_backend_name() == "postgresql"


def announce(s: Session) -> None:
    """In the committing transaction, after the revision bump: delivered on commit, dropped on rollback."""
    s.execute(NOTIFY)


def revision_of(payload: str) -> int | None:
    try:
        return int(payload)
    except ValueError:
        return None


class ConfigListener:
    """A thread that runs ``LISTEN serving_config`` and calls ``on_change(revision)`` on each
    notification (None: unknown, after a (re)connect), reconnecting with backoff on errors."""

    def __init__(self, database_url: str, on_change: Callable[[int | None], None], wait_s: float = 0.5) -> None:
        self.database_url = database_url
        self.on_change = on_change
        self.wait_s = wait_s  # longest wait for a notification before looking at the stop flag
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-listener", daemon=True)

    def start(self) -> "ConfigListener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._listen()
                return
            except Exception as exc:
                if self.connected.is_set():
                    backoff = 0.5  # it was listening until now: a fresh failure
                self.connected.clear()
                log.warning("config notifications: %s; listening again in %.1f s", exc, backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, 10.0)

    def _listen(self) -> None:
        with dedicated_connection(self.database_url, "config listener") as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.connected.set()
            self._deliver(None)  # what was committed while not listening
            while not self._stop.is_set():
                for note in conn.notifies(timeout=self.wait_s):
                    self._deliver(revision_of(note.payload))

    def _deliver(self, revision: int | None) -> None:
        try:
            self.on_change(revision)
        except Exception as exc:  # the database briefly down: the next notification or the poll catches up
            log.warning("config refresh on a notification failed: %s", exc)
