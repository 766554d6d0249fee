"""The control plane under concurrent writes and hostile numbers, as a real process on a real socket,
on SQLite and on a real PostgreSQL: no 500, ever; versions allocated without gaps or duplicates."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.registry.test_api import tiny_onnx
from tests.serving.stack import make_stack
from tests.support.procs import REPO

CONCURRENCY = 8


@pytest.fixture
def control_plane(database_url: str, tmp_path: Path):
    stack = make_stack(tmp_path / "home", workers=0)
    stack.env["SERVING_DATABASE_URL"] = database_url
    stack.start_control_plane()
    try:
        yield stack
    finally:
        stack.stop_all()


def _upload(client: httpx.Client, data: bytes, name: str, i: int) -> list[int]:
    """What `serving model upload` does: the artifact, then the model version."""
    statuses = []
    r = client.post("/artifacts", content=data)
    statuses.append(r.status_code)
    if r.status_code == 201:
        r = client.post("/models", json={"name": name, "artifact": r.json()["sha256"], "metadata": {"i": i}})
        statuses.append(r.status_code)
    return statuses


@pytest.mark.timeout(180)
def test_40_concurrent_uploads_of_one_name_give_40_contiguous_versions(control_plane, tmp_path):
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    with control_plane.api(timeout=60) as client, \
            ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(lambda i: _upload(client, data, "same", i), range(40)))
        models = client.get("/models", params={"name": "same"}).json()
    errors = [s for s in results if s != [201, 201]]
    assert errors == [], f"{len(errors)} failed uploads: {errors}"
    assert sorted(m["version"] for m in models) == list(range(1, 41))
    assert sorted(m["metadata"]["i"] for m in models) == list(range(40))


def model_versions(client, tmp_path, count: int) -> str:
    """Model ``m`` with versions 1..count of one tiny ONNX; its artifact's sha256."""
    sha = client.post("/artifacts", content=tiny_onnx(tmp_path / "m.onnx").read_bytes()).json()["sha256"]
    for _ in range(count):
        assert client.post("/models", json={"name": "m", "artifact": sha}).status_code == 201
    return sha


@pytest.mark.timeout(180)
def test_concurrent_promote_rollback_weights_delete_never_500(control_plane, tmp_path):
    with control_plane.api(timeout=60) as client:
        sha = model_versions(client, tmp_path, 3)
        statuses: list[int] = []
        for _round in range(3):
            assert client.post("/endpoints", json={"endpoint": "e", "model": "m", "version": 1}).status_code == 201
            r = client.post("/endpoints", json={"endpoint": "e", "model": "m", "version": 2, "canary": 10})
            assert r.status_code == 201, r.text
            calls = [("POST", "/endpoints/e/promote", None), ("POST", "/endpoints/e/rollback", None),
                     ("PUT", "/endpoints/e/weights", {"weights": {"1": 50, "2": 50}}),
                     ("PUT", "/endpoints/e/log-freq", {"log_freq": 0.5}),
                     ("DELETE", "/models/m?version=3", None)] * 4
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                statuses += list(pool.map(lambda c: client.request(c[0], c[1], json=c[2]).status_code, calls))
            assert client.post("/models", json={"name": "m", "artifact": sha}).status_code == 201
        assert 500 not in statuses and all(s in (200, 404, 409) for s in statuses), statuses
        # exactly one promote or rollback per round found a canary to settle
        ep = client.get("/endpoints/e").json()
        assert [t["weight"] for t in ep["targets"]] == [100.0]
        config = client.get("/config").json()
        assert config["revision"] == client.get("/health").json()["revision"]


BAD_REQUESTS = [
    ("DELETE", "/models/x?version=9223372036854775808", None),
    ("DELETE", "/models/x?version=0", None),
    ("POST", "/endpoints", '{"endpoint": "e", "model": "m", "version": 9223372036854775808}'),
    ("POST", "/endpoints", '{"endpoint": "e", "model": "m", "version": 1, "canary": NaN}'),
    ("POST", "/endpoints", '{"endpoint": "e", "model": "m", "version": 1, "canary": Infinity}'),
    ("PUT", "/endpoints/e/weights", '{"weights": {"1": NaN}}'),
    ("PUT", "/endpoints/e/weights", '{"weights": {"1": Infinity, "2": -Infinity}}'),
    ("PUT", "/endpoints/e/weights", '{"weights": {"9223372036854775808": 100}}'),
    ("PUT", "/endpoints/e/log-freq", '{"log_freq": NaN}'),
    ("PUT", "/endpoints/e/log-freq", '{"log_freq": -Infinity}'),
    ("POST", "/models", '{"name": "m", "artifact": "SHA", "metadata": {"a": [NaN]}}'),
]


@pytest.mark.timeout(120)
def test_out_of_range_and_non_finite_numbers_are_422(control_plane, tmp_path):
    with control_plane.api(timeout=30) as client:
        sha = model_versions(client, tmp_path, 2)
        client.post("/endpoints", json={"endpoint": "e", "model": "m", "version": 1})
        client.post("/endpoints", json={"endpoint": "e", "model": "m", "version": 2, "canary": 10})
        before = client.get("/endpoints/e").json()
        for method, path, body in BAD_REQUESTS:
            r = client.request(method, path, content=body and body.replace("SHA", sha),
                               headers={"content-type": "application/json"})
            assert r.status_code == 422, (method, path, body, r.status_code, r.text)
            assert r.json()["detail"], r.text
        assert client.get("/endpoints/e").json() == before


@pytest.mark.timeout(180)
def test_concurrent_cli_uploads_of_one_name_all_succeed(control_plane, tmp_path):
    path = tiny_onnx(tmp_path / "m.onnx")
    cmd = [sys.executable, "-m", "serving.cli.main", "model", "upload", "--name", "cli", "--path", str(path)]
    procs = [subprocess.Popen(cmd, env=control_plane.env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(CONCURRENCY)]
    outputs = [(p.wait(120), p.stdout.read()) for p in procs]
    assert [code for code, _ in outputs] == [0] * CONCURRENCY, outputs
    models = httpx.get(f"{control_plane.control_plane}/models", params={"name": "cli"},
                       headers=control_plane.headers()).json()
    assert sorted(m["version"] for m in models) == list(range(1, CONCURRENCY + 1))


@pytest.mark.timeout(120)
def test_temp_file_of_an_upload_killed_midway_is_removed_at_restart(tmp_path):
    stack = make_stack(tmp_path / "home", workers=0)
    artifacts = tmp_path / "home" / "artifacts"
    try:
        proc = stack.start("control-plane", ["control-plane"], f"{stack.control_plane}/health")
        sent = threading.Event()

        def body():
            for _ in range(20):
                yield b"x" * (1 << 20)
            sent.set()
            time.sleep(60)  # never finish: the control plane dies first
            yield b""

        def upload():
            try:
                httpx.post(f"{stack.control_plane}/artifacts", content=body(), timeout=90, headers=stack.headers())
            except httpx.HTTPError:
                pass

        threading.Thread(target=upload, daemon=True).start()
        assert sent.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(p.stat().st_size for p in artifacts.glob(".upload-*")) < 20 << 20:
            time.sleep(0.1)
        left = list(artifacts.glob(".upload-*"))
        assert left and sum(p.stat().st_size for p in left) >= 20 << 20
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        stack.procs.pop("control-plane")
        assert list(artifacts.glob(".upload-*")) == left  # nothing else removes it
        stack.start_control_plane()
        assert list(artifacts.glob(".upload-*")) == []
    finally:
        stack.stop_all()


@pytest.mark.timeout(180)
def test_concurrent_deploys_auto_updates_and_variables_never_500(control_plane, tmp_path):
    """The ClearML-style writes (deploy, auto-update, newest weights, variables) queue like the others."""
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    with control_plane.api(timeout=60) as client:
        sha = client.post("/artifacts", content=data).json()["sha256"]
        assert client.post("/models", json={"name": "m", "artifact": sha}).status_code == 201
        assert client.post("/endpoints", json={"endpoint": "auto", "model": "m", "max_versions": 3}).status_code == 201

        def write(i: int) -> int:
            calls = [lambda: client.post("/endpoints", json={"endpoint": f"e{i % 3}", "model": "m"}),
                     lambda: client.post("/models", json={"name": "m", "artifact": sha}),
                     lambda: client.put("/endpoints/auto/newest-weights", json={"weights": [1, 1, 2]}),
                     lambda: client.post("/endpoints/auto/metrics", json={"name": f"v{i % 4}", "kind": "value"})]
            return calls[i % len(calls)]().status_code

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            statuses = list(pool.map(write, range(48)))
        assert all(s < 500 for s in statuses), statuses
        assert statuses.count(201) + statuses.count(200) == len(statuses), statuses
        versions = [t["version"] for t in client.get("/endpoints/auto").json()["targets"]]
        newest = max(m["version"] for m in client.get("/models", params={"name": "m"}).json())
        assert versions == [newest - 2, newest - 1, newest]
