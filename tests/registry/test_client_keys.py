"""Data-plane client keys through a real control-plane process: the API (admin only), the CLI, what
the config snapshot carries (the sha256, never the key), revocation, the audit log."""
from __future__ import annotations

import hashlib
import json
import re

import httpx
import pytest

from tests.registry.test_auth import make_token, stack  # noqa: F401 (the module's control plane)


def test_create_list_revoke_and_the_snapshot(stack):  # noqa: F811
    with stack.api() as admin:
        r = admin.post("/client-keys", json={"name": "web", "endpoints": ["b", "a", "a"], "rate": 2.5})
        assert r.status_code == 201, r.text
        made = r.json()
        key = made.pop("key")
        assert re.fullmatch(r"sk_[0-9a-f]{64}", key)
        assert made["endpoints"] == ["a", "b"] and made["rate"] == 2.5 and made["burst"] == 3  # one second's worth
        assert admin.post("/client-keys", json={"name": "web"}).status_code == 409

        snap = admin.get("/config").json()
        assert snap["client_keys"]["web"] == {"sha256": hashlib.sha256(key.encode()).hexdigest(),
                                              "endpoints": ["a", "b"], "rate": 2.5, "burst": 3,
                                              "tokens_per_minute": None}
        listed = admin.get("/client-keys").json()
        assert [k["name"] for k in listed if k["name"] == "web"] == ["web"]
        every_read = json.dumps(listed) + json.dumps(snap) + json.dumps(admin.get("/audit").json())
        assert key not in every_read and key[3:] not in every_read

        revision = snap["revision"]
        assert admin.delete("/client-keys/web").json() == {"revoked": "web"}
        snap = admin.get("/config").json()
        assert "web" not in snap["client_keys"] and snap["revision"] > revision  # a push
        assert [k["revoked"] for k in admin.get("/client-keys").json() if k["name"] == "web"] == [True]
        assert admin.delete("/client-keys/nobody").status_code == 404

        # a revoked key's name can be given a new key (rotation)
        again = admin.post("/client-keys", json={"name": "web"}).json()
        assert again["key"] != key and again["endpoints"] is None and again["rate"] is None
        assert admin.get("/config").json()["client_keys"]["web"]["sha256"] == hashlib.sha256(
            again["key"].encode()).hexdigest()

        actions = [(e["action"], e["target"]) for e in admin.get("/audit", params={"limit": 10}).json()]
        assert ("DELETE /client-keys/{name}", "web") in actions and ("POST /client-keys", "web") in actions


@pytest.mark.parametrize("body,says", [
    ({"name": "x", "burst": 5}, "burst needs a rate"),
    ({"name": "x", "rate": 0}, "greater than 0"),
    ({"name": "x", "rate": -1}, "greater than 0"),
    ({"name": "x", "endpoints": []}, "name at least one"),
    ({"name": "x", "endpoints": ["a/b"]}, "not an endpoint name"),
    ({"name": "bad name"}, "key name"),
    ({"name": "x", "rate": 1, "burst": 0}, "greater than or equal to 1"),
    ({"name": "x", "tokens_per_minute": 0}, "greater than or equal to 1"),
    ({"name": "x", "tokens_per_minute": 1.5}, "tokens_per_minute"),
])
def test_bad_requests_name_what_is_wrong(stack, body, says):  # noqa: F811
    with stack.api() as admin:
        r = admin.post("/client-keys", json=body)
    assert r.status_code == 422 and says in r.text, r.text


def test_only_admins_manage_keys(stack):  # noqa: F811
    deployer = make_token(stack, "deployer-for-keys", "deployer")
    with httpx.Client(base_url=stack.control_plane, timeout=10) as c:
        for method, path in (("GET", "/client-keys"), ("POST", "/client-keys"), ("DELETE", "/client-keys/x")):
            assert c.request(method, path, json={"name": "x"}).status_code == 401
            r = c.request(method, path, json={"name": "x"}, headers=deployer)
            assert r.status_code == 403 and "needs role admin" in r.json()["detail"], r.text


def test_cli(stack):  # noqa: F811
    made = stack.cli("key", "create", "--name", "cli-key", "--endpoints", "sentiment, other", "--rate", "10",
                     "--burst", "20", "--tokens-per-minute", "5000")
    key = made.stdout.strip()  # stdout holds the key alone, so KEY=$(serving key create ...) works
    assert re.fullmatch(r"sk_[0-9a-f]{64}", key), made.stdout
    said = " ".join(made.stderr.split())
    assert "shown only now" in said and "5000 tokens/min" in said
    listed = json.loads(stack.cli("key", "list", "--json").stdout)
    row = next(k for k in listed if k["name"] == "cli-key")
    assert row["endpoints"] == ["other", "sentiment"] and row["rate"] == 10 and row["burst"] == 20
    assert row["tokens_per_minute"] == 5000
    assert httpx.get(f"{stack.control_plane}/config", headers=stack.headers()).json()["client_keys"]["cli-key"][
        "tokens_per_minute"] == 5000
    assert key not in stack.cli("key", "list").stdout
    stack.cli("key", "revoke", "--name", "cli-key")
    assert "cli-key" not in httpx.get(f"{stack.control_plane}/config", headers=stack.headers()).json()["client_keys"]
    failed = stack.cli("key", "revoke", "--name", "cli-key-nobody", check=False)
    assert failed.returncode != 0 and "no client key named cli-key-nobody" in failed.stdout + failed.stderr


def test_migration_0004_and_keys_on_sqlite_and_postgresql(database_url, tmp_path):
    """The table, its unique name and hash, rotation and revocation on each database users run."""
    from fastapi.testclient import TestClient

    from registry.api import create_app
    from serving.settings import ControlPlaneSettings
    from tests.support import auth

    app = create_app(ControlPlaneSettings(home=tmp_path, database_url=database_url))
    with TestClient(app, headers=auth.headers(tmp_path)) as admin:
        first = admin.post("/client-keys", json={"name": "k", "endpoints": ["e"], "rate": 1.5}).json()
        assert admin.post("/client-keys", json={"name": "k"}).status_code == 409
        assert admin.delete("/client-keys/k").status_code == 200
        second = admin.post("/client-keys", json={"name": "k"}).json()
        assert admin.get("/config").json()["client_keys"] == {"k": {
            "sha256": hashlib.sha256(second["key"].encode()).hexdigest(), "endpoints": None, "rate": None,
            "burst": None, "tokens_per_minute": None}}
        assert first["burst"] == 2 and [r["name"] for r in admin.get("/client-keys").json()] == ["k"]


def test_migration_0006_tokens_per_minute_on_sqlite_and_postgresql(database_url, tmp_path):
    """Keys made before 0006 have no token limit; the column round-trips and 0006 downgrades."""
    from alembic import command
    from fastapi.testclient import TestClient
    from sqlalchemy import inspect, text

    from registry.api import create_app
    from registry.db import make_engine, migrations
    from serving.settings import ControlPlaneSettings
    from tests.support import auth

    engine = make_engine(database_url)
    with migrations(engine) as (conn, cfg):
        command.upgrade(cfg, "0005")
        conn.execute(text("INSERT INTO client_keys (name, key_hash, created_at, revoked) "
                          "VALUES ('old', :h, CURRENT_TIMESTAMP, :f)"), {"h": "0" * 64, "f": False})
        command.upgrade(cfg, "0006")
        assert conn.execute(text("SELECT tokens_per_minute FROM client_keys")).scalar() is None
    engine.dispose()
    home = tmp_path / "home"
    with TestClient(create_app(ControlPlaneSettings(home=home, database_url=database_url)),
                    headers=auth.headers(home)) as admin:
        assert admin.get("/config").json()["client_keys"]["old"]["tokens_per_minute"] is None
        made = admin.post("/client-keys", json={"name": "llm", "tokens_per_minute": 12000}).json()
        assert made["tokens_per_minute"] == 12000 and made["rate"] is None
        assert admin.get("/config").json()["client_keys"]["llm"]["tokens_per_minute"] == 12000
    engine = make_engine(database_url)
    with migrations(engine) as (conn, cfg):
        command.downgrade(cfg, "0005")
        assert "tokens_per_minute" not in {c["name"] for c in inspect(conn).get_columns("client_keys")}
        command.upgrade(cfg, "head")
    engine.dispose()
