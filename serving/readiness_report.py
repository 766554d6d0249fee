"""Tell the control plane what this process can answer for: ``POST /readiness``.

Each worker process (and the embedded Triton) posts a small report after every change of
what it routes (a config applied, a waiting endpoint switched) and every
``HEARTBEAT_S`` otherwise. The control plane keeps the reports in memory only and forgets a
process that stopped reporting (registry/readiness.py); `serving model add --wait` and
`serving endpoint list` read them. Posting runs on a thread of its own: it never delays a
config swap or a request, and a control plane that is down costs a log line at debug level.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Callable

import httpx

from serving.credentials import auth_headers, worker_token

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0  # the control plane forgets a process after 3 missed heartbeats


def process_id(kind: str) -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}"


class ReadinessReporter:
    def __init__(self, control_plane_url: str, source: str, build: Callable[[], dict[str, Any]],
                 kind: str = "worker", token: Callable[[], str | None] = worker_token) -> None:
        self.url = control_plane_url.rstrip("/") + "/readiness"
        self.source, self.kind, self.build, self.token = source, kind, build, token
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readiness-report", daemon=True)
        # one client for the process's life: a new one per report built a TLS context each time, 6% of a
        # busy worker's samples on the core its requests run on
        self._client = httpx.Client(timeout=2.0)

    def start(self) -> "ReadinessReporter":
        # httpx logs each request at INFO: a heartbeat every 5 s would fill the process's log
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._thread.start()
        return self

    def poke(self) -> None:
        """Something changed: report now (coalesced with any report already due)."""
        self._wake.set()

    def stop(self, say_gone: bool = True) -> None:
        """``say_gone``: withdraw this process's report, so nobody waits for a process that left."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=3.0)  # a report under way ends before the client closes
        if say_gone:
            self._post({"source": self.source, "kind": self.kind, "gone": True})
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(HEARTBEAT_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                report = self.build()
            except Exception:
                log.exception("readiness report could not be built")
                continue
            self._post({"source": self.source, "kind": self.kind, **report})

    def _post(self, body: dict[str, Any]) -> None:
        try:
            r = self._client.post(self.url, json=body, headers=auth_headers(self.token()))
            if r.status_code >= 400:
                log.warning("readiness report refused (%s): %s", r.status_code, r.text[:200])
        except httpx.HTTPError as exc:
            log.debug("readiness report not delivered: %s", exc)
