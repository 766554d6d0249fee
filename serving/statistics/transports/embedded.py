"""Embedded transport: the worker POSTs batches to the statistics service over HTTP.

Why HTTP and not a local queue, a socket file or shared memory: ``serving up`` runs
workers and the statistics service as separate processes that may later sit on
separate hosts, and the statistics service already runs an HTTP server for
Prometheus. One keep-alive connection, one POST per batch (hundreds of events),
is cheap and needs nothing installed. If the service is down the recorder retries
a little and then drops, counting, so workers never depend on it.
"""
from __future__ import annotations

import httpx

from serving.statistics.transports import SendError

EVENTS_PATH = "/events"


class HttpSender:
    def __init__(self, base_url: str, timeout: float = 5.0, token=None) -> None:
        """``token``: the worker token (a string, or a function read before each batch) sent as
        ``Authorization: Bearer``; the service refuses events without one."""
        self.url = base_url.rstrip("/") + EVENTS_PATH
        self._client = httpx.Client(timeout=timeout, headers={"content-type": "application/json"})
        self._token = token
        self._rejected = 0

    def send(self, payload: bytes, count: int) -> None:
        token = self._token() if callable(self._token) else self._token
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            resp = self._client.post(self.url, content=payload, headers=headers)
        except httpx.HTTPError as exc:
            raise SendError(f"POST {self.url}: {exc}") from exc
        if resp.status_code >= 500:
            raise SendError(f"POST {self.url}: HTTP {resp.status_code}")
        if resp.status_code >= 400:  # rejected as malformed: retrying cannot help
            self._rejected += count

    def failed_events(self) -> int:
        return self._rejected

    def close(self, timeout: float) -> None:
        self._client.close()
