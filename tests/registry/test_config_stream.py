"""The SSE config stream over a real socket, followed by serving.config_client."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx

from registry.api import create_app
from registry.broadcast import Broadcaster
from serving.config_client import ConfigSubscriber, read_cache
from serving.settings import ControlPlaneSettings
from tests.support.auth import headers, token
from tests.support.servers import serve_in_thread


class Seen:
    def __init__(self) -> None:
        self.revisions: list[int] = []
        self.changed = threading.Condition()

    def __call__(self, snap: dict) -> None:
        with self.changed:
            self.revisions.append(snap["revision"])
            self.changed.notify_all()

    def wait_for(self, revision: int, timeout: float) -> float:
        start = time.monotonic()
        with self.changed:
            assert self.changed.wait_for(lambda: revision in self.revisions, timeout), self.revisions
        return time.monotonic() - start


class StreamsOpened:
    """The app, counting the config streams its clients open."""

    def __init__(self, app) -> None:
        self.app, self.opened = app, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/config/stream":
            self.opened += 1
        await self.app(scope, receive, send)


def test_changes_are_pushed_at_once_and_cached(tmp_path, monkeypatch):
    """The commit itself wakes the open stream: with the control plane's periodic database check and
    the stream's keepalives (each of which also re-reads the revision) off, the change still reaches the
    subscriber, over the one stream it opened. (Not timed: the suite runs on a saturated machine, where
    a 1 s bound on the push failed CI.)"""
    async def no_database_check(self, period: float = 1.0) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Broadcaster, "watch_database", no_database_check)
    monkeypatch.setattr(Broadcaster.stream, "__defaults__", (3600.0,))  # keepalive
    app = StreamsOpened(create_app(ControlPlaneSettings(home=tmp_path)))
    cache = tmp_path / "worker-config.json"
    seen = Seen()
    with serve_in_thread(app) as url:
        sub = ConfigSubscriber(url, seen, cache_path=cache, token=token(tmp_path, "worker")).start()
        seen.wait_for(0, timeout=30)
        sha = httpx.post(f"{url}/artifacts", content=b"x", headers=headers(tmp_path)).json()["sha256"]
        httpx.post(f"{url}/models", json={"name": "m", "artifact": sha, "framework": "custom"}, headers=headers(tmp_path))
        httpx.post(f"{url}/endpoints", json={"endpoint": "e", "model": "m", "engine": "custom"}, headers=headers(tmp_path))
        seen.wait_for(2, timeout=30)
        sub.stop()
    assert app.opened == 1, f"the subscriber reconnected {app.opened - 1} time(s) to get the change"
    assert read_cache(cache)["endpoints"]["e"]["targets"][0]["model"] == "m"


def test_subscriber_serves_cache_while_control_plane_is_down_then_reconnects(tmp_path):
    settings = ControlPlaneSettings(home=tmp_path)
    cache = tmp_path / "worker-config.json"
    with serve_in_thread(create_app(settings)) as url:
        httpx.post(f"{url}/artifacts", content=b"x", headers=headers(tmp_path))
        sha = httpx.post(f"{url}/artifacts", content=b"x", headers=headers(tmp_path)).json()["sha256"]
        httpx.post(f"{url}/models", json={"name": "m", "artifact": sha, "framework": "custom"}, headers=headers(tmp_path))
        first = Seen()
        sub = ConfigSubscriber(url, first, cache_path=cache, token=token(tmp_path, "worker")).start()
        first.wait_for(1, timeout=5)
        sub.stop()
    port = int(url.rsplit(":", 1)[1])
    # Control plane down: a new subscriber starts from the cache alone.
    seen = Seen()
    sub = ConfigSubscriber(url, seen, cache_path=cache, token=token(tmp_path, "worker"), max_backoff=0.2).start()
    assert seen.revisions == [1]
    # It comes back (same database, same port): the subscriber reconnects by itself.
    with serve_in_thread(create_app(settings), port=port) as url:
        httpx.post(f"{url}/models", json={"name": "m", "artifact": sha, "framework": "custom"}, headers=headers(tmp_path))
        seen.wait_for(2, timeout=5)
    sub.stop()
