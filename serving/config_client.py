"""Follow the control plane's config stream (Server-Sent Events) from any process.

Workers, the embedded Triton and the statistics service all need the newest
snapshot the moment it is committed, and must keep serving the last one they
saw when the control plane is down or restarting. The subscriber therefore:
applies the cached snapshot at once, then streams, writes every new snapshot to
the cache atomically, and reconnects with capped backoff forever.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import httpx

from serving.credentials import auth_headers, worker_token

log = logging.getLogger(__name__)

Snapshot = dict[str, Any]


def read_cache(path: Path | None) -> Snapshot | None:
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        log.warning("ignoring unreadable config cache %s", path)
        return None


def write_cache(path: Path, snapshot: Snapshot) -> None:
    """Write-then-rename, so a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(snapshot, f)
    os.replace(tmp, path)


def iter_sse(lines) -> Any:
    """Yield the ``data`` of each ``config`` event of an SSE line stream."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data and event == "config":
                yield "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


class ConfigSubscriber:
    """Calls ``on_snapshot`` with each newer snapshot, from a daemon thread."""

    def __init__(
        self,
        control_plane_url: str,
        on_snapshot: Callable[[Snapshot], None],
        cache_path: Path | None = None,
        max_backoff: float = 2.0,
        token: str | Callable[[], str | None] | None = None,
    ) -> None:
        self.url = control_plane_url.rstrip("/") + "/config/stream"
        # the worker token: given, or SERVING_WORKER_TOKEN / $SERVING_HOME/tokens/worker read at each connect
        self._token = token if token is not None else worker_token
        self.on_snapshot = on_snapshot
        self.cache_path = cache_path
        self.max_backoff = max_backoff
        self.revision = -1
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-subscriber", daemon=True)

    def start(self) -> "ConfigSubscriber":
        cached = read_cache(self.cache_path)
        if cached is not None:
            log.info("serving cached config revision %s", cached.get("revision"))
            self._apply(cached, persist=False)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, snapshot: Snapshot, persist: bool = True) -> None:
        revision = int(snapshot.get("revision", 0))
        if revision == self.revision:
            return
        # A lower revision is applied too: the control plane may have been reset.
        self.on_snapshot(snapshot)
        self.revision = revision
        if persist and self.cache_path is not None:
            write_cache(self.cache_path, snapshot)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                timeout = httpx.Timeout(5.0, read=30.0)
                token = self._token() if callable(self._token) else self._token
                with httpx.stream("GET", self.url, timeout=timeout, headers=auth_headers(token)) as resp:
                    if resp.status_code in (401, 403):
                        log.warning("config stream refused (%s): %s; set SERVING_WORKER_TOKEN to a worker token",
                                    resp.status_code, resp.read().decode(errors="replace")[:200])
                    resp.raise_for_status()
                    self.connected.set()
                    backoff = 0.1
                    for data in iter_sse(resp.iter_lines()):
                        self._apply(json.loads(data))
                        if self._stop.is_set():
                            return
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("config stream: %s", exc)
            except Exception:  # never let the follower die; keep serving the last config
                log.exception("config subscriber error")
            self.connected.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)
