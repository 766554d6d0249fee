"""TorchServe's management API on the control plane (registry/torchserve_api.py): every route, in
TorchServe's shapes, against the control plane's own app in-process (the archives are real ones from
torch-model-archiver; no worker runs: readiness comes from reports posted as a worker posts them), and
once as the `serving control-plane` process serving both ports."""
from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from registry.api import create_app
from registry.torchserve_api import create_management_app
from serving.ports import free_port
from serving.settings import ControlPlaneSettings
from tests.support.auth import headers, token

ARCHIVER = Path(sys.executable).with_name("torch-model-archiver")
HANDLER = "def handle(data, context):\n    return [{{'version': {version!r}}} for _ in data or []]\n"


def build_archive(dest: Path, name: str, version: str, file_name: str | None = None) -> Path:
    """A tiny function-handler archive, as a TorchServe user's job builds one."""
    src = dest / f"src-{name}-{version}"
    src.mkdir(parents=True, exist_ok=True)
    (src / "noop_handler.py").write_text(HANDLER.format(version=version))
    out = dest / f"out-{name}-{version}"
    out.mkdir(exist_ok=True)
    subprocess.run([str(ARCHIVER), "--model-name", name, "--version", version, "--handler",
                    str(src / "noop_handler.py"), "--export-path", str(out), "--force"], check=True, timeout=60)
    target = dest / (file_name or f"{name}.mar")
    (out / f"{name}.mar").rename(target)
    return target


class Plane:
    """The control plane's API and the management API over it, both with the admin token."""

    def __init__(self, api: TestClient, ts: TestClient, home: Path, store: Path) -> None:
        self.api, self.ts, self.home, self.store = api, ts, home, store

    def archive(self, name: str, version: str, file_name: str | None = None) -> str:
        return build_archive(self.store, name, version, file_name).name

    def register(self, url: str, **params) -> httpx.Response:
        return self.ts.post("/models", params={"url": url, **params})

    def targets(self, name: str) -> list[tuple[int, float, str]]:
        ep = self.api.get(f"/endpoints/{name}").json()
        return sorted((t["version"], t["weight"], t["role"]) for t in ep["targets"])

    def report(self, name: str, state: str, serving: list, error: str | None = None) -> None:
        """A worker process's readiness report for the current revision (serving/readiness_report.py)."""
        revision = self.api.get("/config").json()["revision"]
        body = {"source": "worker:test:4242", "kind": "worker", "revision": revision,
                "endpoints": {name: {"state": state, "serving": serving, "waiting": [], "error": error}}}
        answer = self.api.post("/readiness", json=body, headers=headers(self.home, "worker"))
        assert answer.status_code == 204, answer.text


@pytest.fixture
def plane(tmp_path: Path):
    home, store = tmp_path / "home", tmp_path / "model-store"
    store.mkdir()
    settings = ControlPlaneSettings(home=home, database_url=f"sqlite:///{tmp_path / 'registry.db'}",
                                    torchserve_model_store=store)
    app = create_app(settings)
    with TestClient(app) as api, TestClient(create_management_app(app, settings)) as ts:
        api.headers.update(headers(home))
        ts.headers.update(headers(home))
        yield Plane(api, ts, home, store)


def until(done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def error(answer: httpx.Response, status: int, kind: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"code", "type", "message"} and body["code"] == status and body["type"] == kind, body
    return body["message"]


def test_register_from_the_model_store_then_list_and_describe(plane):
    url = plane.archive("noop", "1.0")
    answer = plane.register(url)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": 'Model "noop" Version: 1.0 registered with 1 initial workers (loading)'}
    ep = plane.api.get("/endpoints/noop").json()
    assert ep["engine"] == "torchserve" and plane.targets("noop") == [(1, 100.0, "stable")]
    assert plane.ts.get("/models").json() == {"models": [{"modelName": "noop", "modelUrl": "noop.mar"}]}
    (described,) = plane.ts.get("/models/noop").json()
    assert {k: described[k] for k in ("modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers",
                                      "batchSize", "maxBatchDelay", "loadedAtStartup", "workers")} == {
        "modelName": "noop", "modelVersion": "1.0", "modelUrl": "noop.mar", "runtime": "python", "minWorkers": 1,
        "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 100, "loadedAtStartup": False, "workers": []}
    (entry,) = [e for e in plane.api.get("/audit").json() if e["action"].startswith("POST torchserve:")]
    assert entry["action"] == "POST torchserve:/models" and entry["target"] == "noop"
    assert entry["actor"] == "bootstrap-admin" and "url=noop.mar" in entry["detail"]["query"]


def test_a_second_version_is_loaded_beside_the_default_until_set_default(plane):
    assert plane.register(plane.archive("noop", "1.0")).status_code == 200
    answer = plane.register(plane.archive("noop", "2.0", "noop-v2.mar"), batch_size=4, max_batch_delay=50)
    assert answer.status_code == 200, answer.text
    assert plane.targets("noop") == [(1, 100.0, "stable"), (2, 0.0, "canary")]  # loaded, routed 0%
    assert plane.ts.get("/models/noop").json()[0]["modelVersion"] == "1.0"
    both = plane.ts.get("/models/noop/all").json()
    assert [(d["modelVersion"], d["modelUrl"], d["batchSize"], d["isDefault"]) for d in both] == [
        ("1.0", "noop.mar", 4, True), ("2.0", "noop-v2.mar", 4, False)]  # batching: the endpoint's, shared
    assert plane.ts.get("/models/noop/2.0").json() == plane.ts.get("/models/noop/2").json()  # our number too

    answer = plane.ts.put("/models/noop/2.0/set-default")
    assert answer.status_code == 200 and answer.json() == {"status": 'Default version of model "noop" is now "2.0"'}
    routed = plane.api.get("/config").json()["endpoints"]["noop"]["targets"]  # what the workers route
    assert sorted((t["version"], t["weight"], t["role"]) for t in routed) == [(1, 0.0, "canary"), (2, 100.0, "stable")]
    assert plane.ts.get("/models/noop").json()[0]["modelVersion"] == "2.0"
    assert plane.ts.get("/models").json()["models"] == [{"modelName": "noop", "modelUrl": "noop-v2.mar"}]

    assert "default version" in error(plane.ts.delete("/models/noop/2.0"), 403, "InvalidModelVersionException")
    error(plane.ts.delete("/models/noop"), 403, "InvalidModelVersionException")  # the default, while 1.0 remains
    assert plane.ts.delete("/models/noop/1.0").json() == {"status": 'Model "noop" unregistered'}
    assert plane.targets("noop") == [(2, 100.0, "stable")]
    assert plane.ts.delete("/models/noop").status_code == 200  # the last version: the endpoint goes
    assert plane.api.get("/endpoints/noop").status_code == 404
    assert error(plane.ts.get("/models/noop"), 404, "ModelNotFoundException") == "Model not found: noop"
    assert [m["version"] for m in plane.api.get("/models", params={"name": "noop"}).json()] == [1, 2]  # kept
    assert plane.register("noop.mar").status_code == 200  # registered again: the same registry version
    assert [m["version"] for m in plane.api.get("/models", params={"name": "noop"}).json()] == [1, 2]
    actions = {e["action"] for e in plane.api.get("/audit").json()}
    assert {"PUT torchserve:/models/{model_name}/{version}/set-default",
            "DELETE torchserve:/models/{model_name}/{version}", "DELETE torchserve:/models/{model_name}"} <= actions


def test_registration_parameters_in_a_json_body(plane):
    url = plane.archive("noop", "1.0")
    answer = plane.ts.post("/models", json={"url": url, "model_name": "json-model", "initial_workers": 2,
                                            "batch_size": 8, "max_batch_delay": 20, "synchronous": False})
    assert answer.status_code == 202, answer.text
    assert plane.api.get("/endpoints/json-model").json()["engine_options"] == {
        "batch_size": 8, "max_batch_delay": 20, "workers": 2}
    (described,) = plane.ts.get("/models/json-model/1.0").json()
    assert (described["batchSize"], described["maxBatchDelay"], described["minWorkers"]) == (8, 20, 2)
    error(plane.ts.post("/models", content=b"[1]", headers={"Content-Type": "application/json"}), 400,
          "BadRequestException")


def test_a_version_registered_twice_is_a_conflict(plane):
    url = plane.archive("noop", "1.0")
    assert plane.register(url).status_code == 200
    assert error(plane.register(url), 409, "ConflictStatusException") == \
        "Model version 1.0 is already registered for model noop"
    error(plane.register(plane.archive("noop", "1.0", "other.mar")), 409, "ConflictStatusException")  # same --version
    assert plane.targets("noop") == [(1, 100.0, "stable")]


@pytest.fixture
def http_folder(tmp_path: Path):
    """A loopback HTTP server of a folder, as an artifact server or S3's https URLs serve archives."""
    folder = tmp_path / "www"
    folder.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_register_from_an_http_url_within_the_size_limit(plane, http_folder):
    folder, base = http_folder
    build_archive(folder, "web", "3.1")
    answer = plane.register(f"{base}/web.mar", model_name="web-model", initial_workers=2)
    assert answer.status_code == 202 and answer.json() == {"status": "Processing worker updates..."}
    (described,) = plane.ts.get("/models/web-model").json()
    assert (described["modelUrl"], described["modelVersion"], described["minWorkers"]) == (f"{base}/web.mar", "3.1", 2)
    assert plane.api.get("/endpoints/web-model").json()["engine_options"] == {"workers": 2}
    assert "HTTP 404" in error(plane.register(f"{base}/missing.mar"), 400, "BadRequestException")
    signed = f"http://user:pw@{base.removeprefix('http://')}/web.mar?X-Amz-Signature=secret"  # a presigned URL
    assert plane.register(signed, model_name="signed").status_code == 200
    assert plane.ts.get("/models/signed").json()[0]["modelUrl"] == f"{base}/web.mar"  # its credentials not kept
    plane.api.app.state.max_artifact_bytes = 100
    assert "larger than the limit of 100 bytes" in error(plane.register(f"{base}/web.mar", model_name="other"), 400,
                                                         "BadRequestException")
    assert plane.api.get("/endpoints/other").status_code == 404


def test_urls_leading_out_of_the_model_store_are_refused(plane, tmp_path):
    secret = tmp_path / "secret.mar"
    build_archive(tmp_path, "secret", "1.0").rename(secret)
    (plane.store / "link.mar").symlink_to(secret)
    (plane.store / "sub").mkdir()
    for url in ("../secret.mar", str(secret), "sub/../../secret.mar", "link.mar", "./noop.mar", "file://" + str(secret)):
        error(plane.register(url), 400, "BadRequestException")
    assert "not found" in error(plane.register("absent.mar"), 400, "BadRequestException")
    assert error(plane.ts.post("/models"), 400, "BadRequestException") == "Parameter url is required."
    (plane.store / "notes.mar").write_text("not an archive")
    assert "not a TorchServe model archive" in error(plane.register("notes.mar"), 400, "BadRequestException")
    assert plane.api.get("/endpoints").json() == []


def test_tokens_and_roles(plane):
    plane.register(plane.archive("noop", "1.0"))
    bare = TestClient(plane.ts.app)
    answer = bare.get("/models")
    error(answer, 401, "InvalidKeyException")
    assert answer.headers["www-authenticate"] == "Bearer"
    error(bare.get("/models", headers={"Authorization": "Bearer srv_nope"}), 401, "InvalidKeyException")
    tokens = {role: plane.api.post("/tokens", json={"name": role, "role": role}).json()["token"]
              for role in ("viewer", "deployer")}
    as_role = {role: {"Authorization": f"Bearer {t}"} for role, t in tokens.items()}
    worker = {"Authorization": f"Bearer {token(plane.home, 'worker')}"}
    assert bare.get("/models/noop", headers=as_role["viewer"]).status_code == 200
    error(bare.get("/models", headers=worker), 403, "InvalidKeyException")
    error(bare.put("/models/noop/1.0/set-default", headers=as_role["viewer"]), 403, "InvalidKeyException")
    assert bare.put("/models/noop/1.0/set-default", headers=as_role["deployer"]).status_code == 200
    assert bare.delete("/models/noop", headers=as_role["deployer"]).status_code == 200
    quota = plane.api.post("/tokens", json={"name": "small", "role": "deployer", "upload_quota_bytes": 100}).json()
    url = plane.archive("big", "1.0")
    assert "upload quota" in error(bare.post("/models", params={"url": url}, headers={
        "Authorization": f"Bearer {quota['token']}"}), 400, "BadRequestException")
    audit = plane.api.get("/audit").json()
    assert any(e["actor"] == "viewer" and e["detail"].get("denied") for e in audit)
    assert any(e["actor"] == "deployer" and e["action"] == "DELETE torchserve:/models/{model_name}" for e in audit)


def test_errors_in_torchserve_shapes(plane):
    plane.register(plane.archive("noop", "1.0"))
    for call in (plane.ts.get("/models/nope"), plane.ts.get("/models/nope/all"), plane.ts.put("/models/nope"),
                 plane.ts.delete("/models/nope/1.0"), plane.ts.put("/models/nope/1.0/set-default")):
        assert error(call, 404, "ModelNotFoundException") == "Model not found: nope"
    for call in (plane.ts.get("/models/noop/9.9"), plane.ts.put("/models/noop/9.9/set-default"),
                 plane.ts.delete("/models/noop/9.9"), plane.ts.put("/models/noop/9.9", params={"min_worker": 2})):
        assert error(call, 404, "ModelVersionNotFoundException") == \
            "Model version: 9.9 does not exist for model: noop"
    url = plane.archive("two", "1.0")
    for bad in ({"batch_size": "abc"}, {"batch_size": 0}, {"initial_workers": 500}, {"model_name": "no good"},
                {"runtime": "LSP"}, {"handler": "other:handle"}, {"startup_timeout": -5}):
        error(plane.register(url, **bad), 400, "BadRequestException")
    assert error(plane.ts.put("/models/noop", params={"min_worker": 3, "max_worker": 2}), 400,
                 "BadRequestException") == "max_worker cannot be less than min_worker."
    error(plane.ts.put("/models/noop", params={"min_worker": 0}), 400, "BadRequestException")
    error(plane.ts.get("/models", params={"limit": "x"}), 400, "BadRequestException")
    error(plane.ts.get("/nothing/here"), 404, "ResourceNotFoundException")
    error(plane.ts.patch("/models"), 405, "MethodNotAllowedException")
    assert plane.register(url, runtime="PYTHON", handler="noop_handler.py").status_code == 200
    assert plane.api.get("/endpoints").json()[0]["engine"] == "torchserve"


def test_list_pages_and_other_engines_are_not_torchserve_models(plane):
    for name in ("c", "a", "b"):
        plane.register(plane.archive(name, "1.0"))
    first = plane.ts.get("/models", params={"limit": 2}).json()
    assert first == {"nextPageToken": "2", "models": [{"modelName": "a", "modelUrl": "a.mar"},
                                                      {"modelName": "b", "modelUrl": "b.mar"}]}
    assert plane.ts.get("/models", params={"limit": 2, "next_page_token": 2}).json() == {
        "models": [{"modelName": "c", "modelUrl": "c.mar"}]}
    assert len(plane.ts.get("/models", params={"limit": 500}).json()["models"]) == 3
    plane.api.post("/endpoints", json={"endpoint": "custom-ep", "engine": "custom", "preprocess": {
        "kind": "user", "artifact": plane.api.post("/artifacts", content=b"x = 1\n").json()["sha256"]}})
    assert "custom-ep" not in [m["modelName"] for m in plane.ts.get("/models").json()["models"]]
    error(plane.ts.get("/models/custom-ep"), 404, "ModelNotFoundException")
    assert "engine custom" in error(plane.register("a.mar", model_name="custom-ep"), 409, "ConflictStatusException")


def test_scaling_sets_the_handler_processes_of_every_version(plane):
    plane.register(plane.archive("noop", "1.0"))
    plane.register(plane.archive("noop", "2.0", "v2.mar"))
    answer = plane.ts.put("/models/noop", params={"min_worker": 3, "max_worker": 6})
    assert answer.status_code == 202 and answer.json() == {"status": "Processing worker updates..."}
    assert plane.api.get("/endpoints/noop").json()["engine_options"] == {"workers": 3}
    assert [d["minWorkers"] for d in plane.ts.get("/models/noop/all").json()] == [3, 3]
    started = time.monotonic()
    message = error(plane.ts.put("/models/noop/2.0", params={"min_worker": 2, "synchronous": "true",
                                                                "startup_timeout": 1}), 408, "RequestTimeoutException")
    assert "no worker process reports" in message and 1 <= time.monotonic() - started < 10


def test_synchronous_registration_waits_for_the_workers(plane):
    url = plane.archive("noop", "1.0")
    started = time.monotonic()
    message = error(plane.register(url, synchronous="true", startup_timeout=1), 408, "RequestTimeoutException")
    assert 1 <= time.monotonic() - started < 10 and "no worker process reports" in message
    assert plane.ts.get("/models/noop").status_code == 200  # registered all the same: it goes on loading

    answers: list[httpx.Response] = []
    url2 = plane.archive("noop", "2.0", "v2.mar")
    waiting = threading.Thread(target=lambda: answers.append(plane.register(url2, synchronous="true",
                                                                            startup_timeout=30)))
    waiting.start()
    until(lambda: len(plane.targets("noop")) == 2)
    time.sleep(0.3)
    assert not answers  # waiting on the workers
    plane.report("noop", "ready", [[1, 100.0, "stable"], [2, 0.0, "canary"]])
    waiting.join(30)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json() == {"status": 'Model "noop" Version: 2.0 registered with 1 initial workers'}
    workers = plane.ts.get("/models/noop/2.0").json()[0]["workers"]
    assert [(w["status"], w["pid"]) for w in workers] == [("READY", 4242)]

    url3 = plane.archive("noop", "3.0", "v3.mar")
    waiting = threading.Thread(target=lambda: answers.append(plane.register(url3, synchronous="true",
                                                                            startup_timeout=30)))
    waiting.start()
    until(lambda: len(plane.targets("noop")) == 3)
    plane.report("noop", "failed", [[1, 100.0, "stable"], [2, 0.0, "canary"]], error="handler raised ImportError")
    waiting.join(30)
    assert "handler raised ImportError" in error(answers[1], 400, "BadRequestException")
    assert plane.targets("noop") == [(1, 100.0, "stable"), (2, 0.0, "canary")]  # undone, as TorchServe does


@pytest.mark.timeout(120)
def test_the_control_plane_process_serves_both_ports(tmp_path):
    ports = {"cp": free_port(), "ts": free_port()}
    env = {**os.environ, "SERVING_HOME": str(tmp_path / "home"), "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
           "SERVING_TORCHSERVE_MANAGEMENT_PORT": str(ports["ts"]), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "cp.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "control-plane"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"http://127.0.0.1:{ports['ts']}/models"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        auth = headers(tmp_path / "home")
        assert httpx.get(f"http://127.0.0.1:{ports['ts']}/models", headers=auth).json() == {"models": []}
        assert httpx.get(f"http://127.0.0.1:{ports['cp']}/health").json()["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()  # both servers stopped, gracefully
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with socket.socket() as taken:  # the management port in use: said at once, naming the setting
        taken.bind(("127.0.0.1", ports["ts"]))
        taken.listen()
        done = subprocess.run([sys.executable, "-m", "serving.cli.main", "control-plane"], env=env, timeout=60,
                              capture_output=True, text=True)
    assert done.returncode != 0 and "SERVING_TORCHSERVE_MANAGEMENT_PORT" in done.stderr, done.stderr[-2000:]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 401
    except httpx.HTTPError:
        return False
