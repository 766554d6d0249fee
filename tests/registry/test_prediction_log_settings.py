"""An endpoint's prediction-log settings through the control plane (SQLite and PostgreSQL): set, shown on
the endpoint, pushed in the snapshot, audited; bad settings are a 422 naming what is wrong; off is null."""
from __future__ import annotations

import pytest

from tests.registry.test_api import add_model, client, onnx_sha  # noqa: F401 - fixtures


def test_set_shown_pushed_audited_and_turned_off(client, onnx_sha):  # noqa: F811
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    rev = client.get("/config").json()["revision"]
    r = client.put("/endpoints/e/prediction-log", json={"sample": 10, "fields": ["inputs", "outputs"],
                                                         "redact": [r"\b\d{16}\b"]})
    assert r.status_code == 200, r.text
    want = {"sample": 10.0, "fields": ["inputs", "outputs"], "redact": [r"\b\d{16}\b"], "max_bytes": 65536}
    assert r.json() == {"endpoint": "e", "prediction_log": want}
    assert client.get("/endpoints/e").json()["prediction_log"] == want
    config = client.get("/config").json()
    assert config["endpoints"]["e"]["prediction_log"] == want and config["revision"] == rev + 1
    actions = [(e["action"], e["target"]) for e in client.get("/audit", params={"limit": 5}).json()]
    assert ("PUT /endpoints/{name}/prediction-log", "e") in actions
    assert client.put("/endpoints/e/prediction-log", json={"sample": 0}).json()["prediction_log"] is None
    assert client.get("/config").json()["endpoints"]["e"]["prediction_log"] is None


@pytest.mark.parametrize("body,words", [
    ({"sample": 150}, "less than or equal to 100"),
    ({"sample": 10, "fields": ["inputs", "secrets"]}, "unknown field(s) secrets"),
    ({"sample": 10, "redact": ["(unclosed"]}, "not a regular expression"),
    ({"sample": 10, "max_bytes": 10}, "greater than or equal to 256"),
])
def test_bad_settings_are_a_422_naming_what_is_wrong(client, onnx_sha, body, words):  # noqa: F811
    add_model(client, "clf", onnx_sha)
    client.post("/endpoints", json={"endpoint": "e", "model": "clf"})
    r = client.put("/endpoints/e/prediction-log", json=body)
    assert r.status_code == 422 and words in r.text, r.text
    assert client.get("/endpoints/e").json()["prediction_log"] is None, "nothing stored"


def test_an_unknown_endpoint_is_a_404(client):  # noqa: F811
    r = client.put("/endpoints/ghost/prediction-log", json={"sample": 10})
    assert r.status_code == 404 and "ghost" in r.text


def test_migration_0007_on_sqlite_and_postgresql(database_url, tmp_path):
    """Endpoints made before 0007 log nothing (null); the column downgrades and upgrades again."""
    from alembic import command
    from sqlalchemy import inspect, text

    from registry.db import make_engine, migrations

    engine = make_engine(database_url)
    with migrations(engine) as (conn, cfg):
        command.upgrade(cfg, "0006")
        conn.execute(text("INSERT INTO endpoints (name, engine, preprocess, batching, log_freq, io, auto_update, "
                          "engine_options, created_at) VALUES ('old', 'onnxruntime', '{}', '{}', 1.0, '{}', '{}', "
                          "'{}', CURRENT_TIMESTAMP)"))
        command.upgrade(cfg, "0007")
        assert conn.execute(text("SELECT prediction_log FROM endpoints WHERE name = 'old'")).scalar() is None
        command.downgrade(cfg, "0006")
        assert "prediction_log" not in {c["name"] for c in inspect(conn).get_columns("endpoints")}
        command.upgrade(cfg, "head")
        assert "prediction_log" in {c["name"] for c in inspect(conn).get_columns("endpoints")}
    engine.dispose()
