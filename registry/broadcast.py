"""Fan-out of config snapshots to every open stream, the moment a change commits.

Changes made by this process wake streams at once; a slow revision check also
catches changes committed by another control-plane replica on the same database.
Every refresh, from a commit or from that check, takes one lock across its read and its
swap: two of them at once could finish out of order, and the one that read before a
commit then put its older snapshot back over the newer one (``GET /config`` right after
a deploy answered without the endpoint until the next check).

Listeners (the external Triton's repository sync) act on the world outside the database, so only
the leading replica runs them (registry/leadership.py); one that becomes leader replays the current
snapshot to them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

import orjson
from sqlalchemy.orm import sessionmaker

from registry.snapshot import build_snapshot

log = logging.getLogger(__name__)


class Broadcaster:
    def __init__(self, sessions: sessionmaker, listeners: list[Callable[[dict], None]] | None = None,
                 leads: Callable[[], bool] = lambda: True) -> None:
        self.sessions = sessions
        self.snapshot: dict = {"revision": -1, "endpoints": {}}
        self.encoded = b""
        self.listeners = listeners or []
        self.leads = leads  # whether this replica runs the listeners
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # a refresh that reads later publishes later

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the snapshot from the database; wake streams if it moved. Safe from any thread."""
        with self._lock:
            self._refresh()

    def refresh_to(self, revision: int | None) -> None:
        """Refresh unless the snapshot is at ``revision`` already (a notification of this replica's own
        commit); None: unknown, refresh."""
        if revision is None or revision > self.snapshot["revision"]:
            self.refresh()

    def replay(self) -> None:
        """Hand the current snapshot to the listeners again: this replica has just become the leader."""
        with self._lock:
            if self.snapshot["revision"] >= 0:  # not the placeholder before the first read: it would empty Triton
                self._notify(self.snapshot)

    def _refresh(self) -> None:
        with self.sessions() as s:
            snap = build_snapshot(s)
        if snap == self.snapshot:
            return
        self.snapshot, self.encoded = snap, orjson.dumps(snap)
        if self.leads():
            self._notify(snap)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _notify(self, snap: dict) -> None:
        for listener in self.listeners:
            try:
                listener(snap)
            except Exception:
                log.exception("snapshot listener failed")

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def stream(self, keepalive: float = 10.0):
        """SSE body: current snapshot now, each newer one as it commits, keepalives between."""
        sent = None
        while True:
            if self.snapshot["revision"] != sent:
                sent = self.snapshot["revision"]
                yield b"event: config\ndata: " + self.encoded + b"\n\n"
            else:
                yield b": keepalive\n\n"
            await self.wait_change(keepalive)

    async def watch_database(self, period: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as exc:  # database briefly down: keep serving the last snapshot
                log.warning("config refresh failed: %s", exc)
