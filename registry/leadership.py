"""Which control-plane replica acts, when several share one database.

Every replica serves the API and the config stream, but some work must be done by one process only:
the rollout controller's steps and decisions, and writing the external Triton's model repository
(two writers of one directory undo each other's loads). The leader does that work; a follower only
serves, and takes over when the leader goes (docs/high-availability.md).

- PostgreSQL: the leader holds a session-level advisory lock on a connection of its own. The lock
  lives as long as that session: a process that exits or crashes closes its socket and the server
  drops the lock at once; a host that vanishes without closing it is given up by the server's TCP
  keepalives in about 10 s (registry/db.py). Each period the leader checks its connection
  (``SELECT 1``): a failed check may mean the lock is gone, so it stops leading then and there, and
  tries again for the lock later.
- SQLite: one machine, so an exclusive ``flock`` on ``<database>.leader``; the kernel drops it when
  the process exits. An in-memory database has one process by definition: it always leads.

For up to one period after a leader loses its lock, it and the new leader may both believe they
lead; the rollout controller's changes are conditional on the step they read (registry/rollouts.py),
so two controllers acting at once still take each step once.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from sqlalchemy import make_url

from registry.db import dedicated_connection

log = logging.getLogger(__name__)

# One key per database (advisory locks are per database): a 64-bit number from a fixed string.
LOCK_KEY = int.from_bytes(hashlib.sha256(b"serving control-plane leader").digest()[:8], "big", signed=True)


class Lock(Protocol):
    def acquire(self) -> bool:
        """Take the lock without waiting; whether this process now holds it."""

    def held(self) -> bool:
        """Whether the lock is still this process's (False: it may be lost; it was released)."""

    def release(self) -> None: ...


class PostgresLock:
    """``pg_try_advisory_lock`` on a dedicated autocommit connection: the session holds the lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None

    def acquire(self) -> bool:
        self.release()
        conn = dedicated_connection(self.url, "control-plane leader")
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]
        except Exception:
            conn.close()
            raise
        if got:
            self._conn = conn
        else:
            conn.close()  # no idle session per follower: a try opens one and closes it
        return bool(got)

    def held(self) -> bool:
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except Exception as exc:
            log.warning("the leader lock's database connection failed: %s", exc)
            self.release()
            return False

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()  # ends the session, which drops the lock
            except Exception:
                pass


class FileLock:
    """An exclusive ``flock`` on a file: held per open file, so each object opens the file itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.release()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{identity()}\n".encode())  # who leads, for whoever looks
        self._fd = fd
        return True

    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class AlwaysHeld:
    """An in-memory database: no other process can share it."""

    def acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return True

    def release(self) -> None:
        pass


def lock_for(database_url: str) -> Lock:
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        return PostgresLock(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return FileLock(Path(f"{url.database}.leader"))
    return AlwaysHeld()


def identity() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


class Leadership:
    """Tries for the leader lock every ``period_s`` while following, checks it while leading.
    ``on_gain`` callables run on its thread each time this process becomes the leader."""

    def __init__(self, database_url: str, period_s: float = 1.0, lock: Lock | None = None) -> None:
        self.lock = lock or lock_for(database_url)
        self.period_s = period_s
        self.on_gain: list[Callable[[], None]] = []
        self._since: datetime | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self._since is not None

    def state(self) -> dict[str, Any]:
        since = self._since
        return {"leader": since is not None, "since": since.isoformat() if since else None, "identity": identity()}

    def start(self) -> "Leadership":
        """A first try at once, so a lone control plane leads from its start; then the thread."""
        self._check()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop trying and give the lock up: another replica leads within its period."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.lock.release()
        self._lost()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._check()

    def _check(self) -> None:
        if self.is_leader:
            if not self.lock.held():
                self._lost()
            return
        try:
            if not self.lock.acquire():
                return
        except Exception as exc:  # database unreachable: follow, and try again next period
            log.warning("cannot try for control-plane leadership: %s", exc)
            return
        self._since = datetime.now(timezone.utc)
        log.info("this control plane leads (%s)", identity())
        for callback in self.on_gain:
            try:
                callback()
            except Exception:
                log.exception("a callback on becoming leader failed")

    def _lost(self) -> None:
        if self._since is not None:
            self._since = None
            log.info("this control plane no longer leads (%s)", identity())
