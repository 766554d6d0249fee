"""Authentication, roles, audit log and upload limits of a real control-plane process on a socket."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from registry.api import create_app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.serving.stack import Stack, make_stack
from tests.support.procs import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    home = tmp_path_factory.mktemp("auth-home")
    stack = make_stack(home, workers=0)
    stack.env["SERVING_MAX_ARTIFACT_BYTES"] = str(1 << 20)
    stack.env["SERVING_CREDENTIALS"] = str(home / "no-credentials")  # never a developer's own login
    stack.env.pop("SERVING_TOKEN", None)
    stack.start_control_plane()
    try:
        yield stack
    finally:
        stack.stop_all()


def make_token(stack: Stack, name: str, role: str, **extra) -> dict[str, str]:
    with stack.api() as admin:
        r = admin.post("/tokens", json={"name": name, "role": role, **extra})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def routes(home: Path) -> list[tuple[str, str]]:
    """Every (method, path) the control plane serves, path parameters filled in."""
    app = create_app(ControlPlaneSettings(home=home, database_url="sqlite://"))
    found = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or []):
            if method == "HEAD":
                continue
            found.append((method, re.sub(r"\{[^}]+\}", "x", route.path)))
    return found


OPEN = {"/health", "/leadership", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def test_every_route_but_health_answers_401_without_or_with_a_bad_token(stack, tmp_path):
    checked = 0
    with httpx.Client(base_url=stack.control_plane, timeout=10) as anon:
        for method, path in routes(tmp_path):
            if path in OPEN:
                continue
            for headers in ({}, {"Authorization": "Bearer srv_forged"}, {"Authorization": "Basic YWRtaW46YWRtaW4="}):
                r = anon.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
            checked += 1
        assert anon.get("/health").status_code == 200
        spec = anon.get("/openapi.json").json()
    assert checked >= 20  # models, artifacts, endpoints, canaries, metrics, tokens, audit, config...
    assert spec["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "description": spec["components"]["securitySchemes"]["HTTPBearer"]["description"]}
    assert spec["paths"]["/endpoints"]["post"]["security"] == [{"HTTPBearer": []}]
    assert spec["paths"]["/health"]["get"]["security"] == []


def test_roles_viewer_reads_deployer_changes_admin_deletes(stack, tmp_path):
    viewer, deployer = make_token(stack, "viewer1", "viewer"), make_token(stack, "deployer1", "deployer")
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    with httpx.Client(base_url=stack.control_plane, timeout=30) as c:
        assert c.get("/models", headers=viewer).status_code == 200
        r = c.post("/artifacts", content=data, headers=viewer)
        assert r.status_code == 403 and "needs role deployer or admin" in r.json()["detail"]
        sha = c.post("/artifacts", content=data, headers=deployer).json()["sha256"]
        assert c.post("/models", json={"name": "rm", "artifact": sha}, headers=deployer).status_code == 201
        r = c.post("/endpoints", json={"endpoint": "re", "model": "rm"}, headers=viewer)
        assert r.status_code == 403 and "viewer" in r.json()["detail"]
        assert c.post("/endpoints", json={"endpoint": "re", "model": "rm"}, headers=deployer).status_code == 201
        assert c.put("/endpoints/re/log-freq", json={"log_freq": 0.5}, headers=deployer).status_code == 200
        # a deployer cannot delete a model or an endpoint, nor manage tokens
        r = c.delete("/endpoints/re", headers=deployer)
        assert r.status_code == 403 and "needs role admin" in r.json()["detail"], r.text
        r = c.delete("/models/rm", headers=deployer)
        assert r.status_code == 403 and "needs role admin" in r.json()["detail"], r.text
        assert c.post("/tokens", json={"name": "x", "role": "admin"}, headers=deployer).status_code == 403
        assert c.get("/tokens", headers=viewer).status_code == 403
        assert c.get("/models", params={"name": "rm"}, headers=viewer).json()[0]["version"] == 1
        admin = stack.headers()
        assert c.delete("/endpoints/re", headers=admin).status_code == 200
        assert c.delete("/models/rm", headers=admin).status_code == 200


def test_worker_token_reads_the_config_stream_and_artifacts_only(stack):
    worker = stack.headers("worker")
    with httpx.Client(base_url=stack.control_plane, timeout=10) as c:
        with c.stream("GET", "/config/stream") as resp:
            assert resp.status_code == 401
        with c.stream("GET", "/config/stream", headers={"Authorization": "Bearer srv_guess"}) as resp:
            assert resp.status_code == 401
        with c.stream("GET", "/config/stream", headers=worker) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(lines) == "event: config" and json.loads(next(lines)[5:])["revision"] >= 0
        assert c.get("/config", headers=worker).status_code == 200
        sha = c.post("/artifacts", content=b"worker-readable", headers=stack.headers()).json()["sha256"]
        r = c.get(f"/artifacts/{sha}", headers=worker)
        assert r.status_code == 200 and r.content == b"worker-readable"
        assert c.get(f"/artifacts/{sha}").status_code == 401
        for method, path in (("GET", "/models"), ("GET", "/endpoints"), ("POST", "/artifacts"), ("GET", "/audit")):
            r = c.request(method, path, headers=worker, content=b"x")
            assert r.status_code == 403, (method, path, r.text)
        assert c.get("/auth/whoami", headers=worker).json() == {"name": "bootstrap-worker", "role": "worker"}


def test_audit_log_records_who_did_what(stack, tmp_path):
    alice = make_token(stack, "alice", "deployer")
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    with httpx.Client(base_url=stack.control_plane, timeout=30) as c:
        sha = c.post("/artifacts", content=data, headers=alice).json()["sha256"]
        c.post("/models", json={"name": "am", "artifact": sha}, headers=alice)
        assert c.post("/endpoints", json={"endpoint": "ae", "model": "am"}, headers=alice).status_code == 201
        c.delete("/endpoints/ae", headers=alice)  # refused: recorded as denied
        assert c.get("/audit", headers={"Authorization": "Bearer nope"}).status_code == 401
        viewer = make_token(stack, "auditor", "viewer")
        # an entry is written just after its answer is sent: the last one may trail the client a little
        log = wait_until(lambda: (entries := c.get("/audit", params={"limit": 50}, headers=viewer).json())
                         and sum(e["actor"] == "alice" for e in entries) >= 4 and entries, 10, "alice's 4 entries")
    mine = [(e["action"], e["target"], e["detail"]["status"]) for e in log if e["actor"] == "alice"]
    assert mine[::-1] == [("POST /artifacts", "", 201), ("POST /models", "am", 201),
                          ("POST /endpoints", "ae", 201), ("DELETE /endpoints/{name}", "ae", 403)]
    upload = next(e for e in log if e["actor"] == "alice" and e["action"] == "POST /artifacts")
    assert upload["detail"]["result"]["sha256"] == sha and upload["at"]
    created = next(e for e in log if e["action"] == "POST /tokens" and e["target"] == "alice")
    assert created["actor"] == "bootstrap-admin" and "token" not in json.dumps(created["detail"]["result"])
    assert not any("srv_" in json.dumps(e) for e in log)  # no token value ever enters the log
    res = stack.cli("audit", "--limit", "5", "--json")
    entries = json.loads(res.stdout)
    assert len(entries) == 5 and all({"at", "actor", "action", "target", "detail"} <= e.keys() for e in entries)


def test_artifact_size_limit_and_upload_quota(stack):
    artifacts = stack.home / "artifacts"

    def chunks(n: int):
        for _ in range(n):
            yield b"y" * (256 << 10)

    with httpx.Client(base_url=stack.control_plane, timeout=30, headers=stack.headers()) as c:
        r = c.post("/artifacts", content=chunks(8))  # 2 MiB streamed, no Content-Length, limit 1 MiB
        assert r.status_code == 413 and "SERVING_MAX_ARTIFACT_BYTES" in r.json()["detail"]
        r = c.post("/artifacts", content=b"z" * ((1 << 20) + 1))  # declared length past it
        assert r.status_code == 413
    assert not list(artifacts.glob(".upload-*")), "the partial temp file is removed"
    quota = make_token(stack, "quota1", "deployer", upload_quota_bytes=1000)
    with httpx.Client(base_url=stack.control_plane, timeout=30, headers=quota) as c:
        assert c.post("/artifacts", content=b"a" * 600).status_code == 201
        r = c.post("/artifacts", content=b"b" * 600)
        assert r.status_code == 413 and "quota" in r.json()["detail"] and "600 of 1000" in r.json()["detail"]
        assert c.post("/artifacts", content=b"c" * 400).status_code == 201
    with stack.api() as admin:
        row = next(t for t in admin.get("/tokens").json() if t["name"] == "quota1")
    assert row["uploaded_bytes"] == 1000 and row["upload_quota_bytes"] == 1000


def test_cli_tokens_login_and_revoke(stack, tmp_path):
    res = stack.cli("token", "create", "--name", "ci-bot", "--role", "deployer")
    token = res.stdout.strip().splitlines()[-1]
    assert token.startswith("srv_")
    listed = json.loads(stack.cli("token", "list", "--json").stdout)
    row = next(t for t in listed if t["name"] == "ci-bot")
    assert row["role"] == "deployer" and "token" not in row and "token_hash" not in row
    creds = tmp_path / "creds"
    env = {**stack.env, "SERVING_CREDENTIALS": str(creds), "SERVING_HOME": str(tmp_path / "elsewhere")}
    stack_cli = Stack(home=stack.home, env=env)
    assert stack_cli.cli("model", "list", check=False).returncode == 1  # no token found: 401
    stack_cli.cli("login", "--token", token, "--control-plane", stack.control_plane)
    assert oct(creds.stat().st_mode & 0o777) == "0o600"
    assert stack_cli.cli("model", "list", "--json").returncode == 0
    stack.cli("token", "revoke", "--name", "ci-bot")
    res = stack_cli.cli("model", "list", check=False)
    assert res.returncode == 1 and "401" in res.stderr and "revoked" in res.stderr


def test_bootstrap_token_files_are_private(stack):
    for role in ("admin", "worker"):
        path = stack.home / "tokens" / role
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct((stack.home / "tokens").stat().st_mode & 0o777) == "0o700"
