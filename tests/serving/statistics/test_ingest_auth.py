"""The statistics service refuses forged events and anonymous reference changes (real processes:
control plane and statistics service, tokens checked through the control plane)."""
from __future__ import annotations

import time

import httpx
import pytest

from serving.statistics.events import SCHEMA
from tests.serving.stack import Stack, make_stack
from tests.support.procs import free_port


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    home = tmp_path_factory.mktemp("ingest-home")
    stack = make_stack(home, workers=0)
    stack.env["SERVING_STATISTICS_PORT"] = str(free_port())
    stack.env.pop("SERVING_WORKER_TOKEN", None)
    stack.start_control_plane()
    stack.start_statistics()
    try:
        yield stack
    finally:
        stack.stop_all()


def stats_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.env['SERVING_STATISTICS_PORT']}"


def batch(endpoint: str, n: int, dropped: int = 0) -> dict:
    events = [{"ts": time.time(), "endpoint": endpoint, "version": 1, "status": 200, "latency_s": 0.01,
               "stages": {}, "custom": {}} for _ in range(n)]
    return {"schema": SCHEMA, "source": "forger:1", "dropped": dropped, "events": events}


def token_of(stack: Stack, name: str, role: str) -> dict[str, str]:
    with stack.api() as admin:
        return {"Authorization": f"Bearer {admin.post('/tokens', json={'name': name, 'role': role}).json()['token']}"}


def test_events_without_a_worker_token_are_refused_and_not_counted(stack):
    url = stats_url(stack)
    viewer = token_of(stack, "stats-viewer", "viewer")
    for headers, status in (({}, 401), ({"Authorization": "Bearer srv_forged"}, 401), (viewer, 403)):
        r = httpx.post(f"{url}/events", json=batch("forged-e", 100, dropped=10**9), headers=headers, timeout=10)
        assert r.status_code == status, (headers, r.text)
    dropped = [line for line in httpx.get(f"{url}/metrics").text.splitlines()
               if line.startswith("serving_statistics_dropped_events_total")]
    assert all(float(line.rsplit(" ", 1)[1]) < 10**9 for line in dropped), dropped
    # the worker token (shared file under SERVING_HOME) and an admin token (checked via the control plane) pass
    r = httpx.post(f"{url}/events", json=batch("forged-e", 3), headers=stack.headers("worker"), timeout=10)
    assert r.status_code == 200 and r.json() == {"accepted": 3}
    worker2 = token_of(stack, "worker-two", "worker")
    assert httpx.post(f"{url}/events", json=batch("forged-e", 2), headers=worker2, timeout=10).status_code == 200
    assert httpx.post(f"{url}/events", json=batch("forged-e", 1), headers=stack.headers(), timeout=10).status_code == 200


def test_reference_changes_need_a_token(stack):
    path = f"{stats_url(stack)}/references/ref-e/1/tokens"
    assert httpx.delete(path, timeout=10).status_code == 401
    assert httpx.put(path, json={"values": [1, 2, 3]}, timeout=10).status_code == 401
    viewer = token_of(stack, "ref-viewer", "viewer")
    assert httpx.delete(path, headers=viewer, timeout=10).status_code == 403
    deployer = token_of(stack, "ref-deployer", "deployer")
    assert httpx.delete(path, headers=deployer, timeout=10).status_code == 200
    assert httpx.get(f"{stats_url(stack)}/health", timeout=10).status_code == 200  # reads stay open
