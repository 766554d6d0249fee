"""Two control-plane replicas on one real PostgreSQL: a change committed through one reaches a worker
streaming from the other within a second, by LISTEN/NOTIFY (registry/config_notify.py): the
replicas' database poll is set to an hour here, so nothing else could carry it. One replica leads
(GET /leadership, GET /health, both open), and when it stops the other leads."""
from __future__ import annotations

import threading
import time

import httpx
import psycopg

from registry import config_notify
from registry.api import create_app
from registry.config_notify import ConfigListener
from registry.db import libpq_url
from serving.config_client import ConfigSubscriber
from serving.settings import ControlPlaneSettings
from tests.support.auth import headers, token
from tests.support.postgres import create_database
from tests.support.procs import wait_until
from tests.support.servers import serve_in_thread

CHANGES = 8


class Received:
    """Each snapshot a worker-side subscriber applied, with the moment it did."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, dict]] = []
        self.changed = threading.Condition()

    def __call__(self, snap: dict) -> None:
        with self.changed:
            self.seen.append((time.monotonic(), snap))
            self.changed.notify_all()

    def first(self, matches, timeout: float) -> float:
        """When the first snapshot that ``matches`` arrived."""
        with self.changed:
            found = self.changed.wait_for(lambda: next((t for t, s in self.seen if matches(s)), None), timeout)
        assert found, f"no such snapshot within {timeout}s; last: {self.seen[-1][1] if self.seen else None}"
        return found


def log_freq(snap: dict) -> float | None:
    return (snap.get("endpoints", {}).get("e") or {}).get("log_freq")


def deploy_endpoint(api: httpx.Client) -> None:
    """Endpoint ``e`` of a custom engine: the cheapest endpoint there is."""
    sha = api.post("/artifacts", content=b"x").json()["sha256"]
    assert api.post("/models", json={"name": "m", "artifact": sha, "framework": "custom"}).status_code == 201
    assert api.post("/endpoints", json={"endpoint": "e", "model": "m", "engine": "custom"}).status_code == 201


def notified_latencies(api: httpx.Client, received: Received) -> list[float]:
    """Seconds from each change's request to its snapshot at the other replica's worker."""
    received.first(lambda s: log_freq(s) is not None, timeout=30)
    latencies = []
    for i in range(1, CHANGES + 1):
        value = i / 100
        sent = time.monotonic()
        assert api.put("/endpoints/e/log-freq", json={"log_freq": value}).status_code == 200
        latencies.append(received.first(lambda s, v=value: log_freq(s) == v, timeout=10) - sent)
        time.sleep(0.2)
    return latencies


def test_a_change_through_one_replica_reaches_the_others_stream_within_a_second(
        postgres_admin_url, tmp_path, monkeypatch):
    monkeypatch.setattr(config_notify, "SAFETY_NET_POLL_S", 3600.0)
    url = create_database(postgres_admin_url, "two_replicas")
    settings = ControlPlaneSettings(home=tmp_path, database_url=url)  # one home: the tokens and artifacts they share
    app_a, app_b = create_app(settings), create_app(settings)
    serving_a = serve_in_thread(app_a)
    a: str | None = serving_a.__enter__()
    try:
        with serve_in_thread(app_b) as b:
            assert httpx.get(f"{a}/leadership").json()["leader"] is True  # open: no token
            follower = httpx.get(f"{b}/leadership").json()
            assert follower["leader"] is False and follower["since"] is None and follower["identity"]
            assert [httpx.get(f"{u}/health").json()["leader"] for u in (a, b)] == [True, False]

            with httpx.Client(base_url=a, headers=headers(tmp_path), timeout=30) as api:
                deploy_endpoint(api)
                received = Received()
                worker = ConfigSubscriber(b, received, token=token(tmp_path, "worker")).start()  # follows B
                try:
                    latencies = notified_latencies(api, received)
                finally:
                    worker.stop()
            print("\nchange through A -> B's config stream, from the request sent (ms): "
                  + ", ".join(f"{t * 1000:.0f}" for t in latencies))
            assert max(latencies) < 1.0, latencies

            stopped = time.monotonic()
            serving_a.__exit__(None, None, None)  # the leader goes
            a = None
            wait_until(lambda: httpx.get(f"{b}/leadership").json()["leader"], timeout=10, interval=0.02,
                       what="replica B to lead")
            print(f"replica B led {time.monotonic() - stopped:.2f} s after replica A began to stop")
            assert httpx.get(f"{b}/health").json()["leader"] is True
    finally:
        if a is not None:
            serving_a.__exit__(None, None, None)


def test_the_listener_listens_again_after_losing_its_connection(postgres_admin_url):
    """The server ends the listener's session: it connects again, refreshes once (a change may
    have been missed meanwhile), and then hears the next notification."""
    url = create_database(postgres_admin_url, "listener_reconnects")
    heard: list[int | None] = []
    listener = ConfigListener(url, heard.append).start()
    try:
        assert listener.connected.wait(10)
        wait_until(lambda: heard == [None], timeout=5, what="the refresh on connecting")
        with psycopg.connect(libpq_url(postgres_admin_url), autocommit=True) as admin:
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE application_name = 'serving config listener' AND datname = %s",
                                  (url.rsplit("/", 1)[1],)).fetchone()[0]
        assert ended == 1
        wait_until(lambda: heard == [None, None] and listener.connected.is_set(), timeout=10,
                   what="the listener to connect again")
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, '7')", (config_notify.CHANNEL,))
        wait_until(lambda: heard == [None, None, 7], timeout=5, what="the notification after the reconnect")
    finally:
        listener.stop()
