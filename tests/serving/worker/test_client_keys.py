"""Client keys in the worker: the check itself (a fake clock for the bucket), and every HTTP door of
an in-process worker over a real onnxruntime model (/serve and /v2 infer and metadata). Real processes and sockets: tests/serving/test_client_keys_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest

from serving.credentials import secret_sha256
from serving.worker.client_keys import ClientKeys, bearer
from serving.worker.errors import Forbidden, ServingError, TooManyRequests, Unauthorized
from tests.serving.worker.support import snapshot
from tests.serving.worker.test_serve_rest import direct
from tests.serving.worker.test_v2 import TEXT, request, tokens
from tests.support.error_bodies import without_ids

ALL, SCOPED, SLOW = "sk_" + "a" * 64, "sk_" + "b" * 64, "sk_" + "c" * 64


def keys_snapshot(*endpoints: dict, rate: float = 2.0, burst: int = 3) -> dict:
    snap = snapshot(*endpoints)
    snap["client_keys"] = {
        "ops": {"sha256": secret_sha256(ALL), "endpoints": None, "rate": None, "burst": None},
        "app": {"sha256": secret_sha256(SCOPED), "endpoints": ["other"], "rate": None, "burst": None},
        "batch": {"sha256": secret_sha256(SLOW), "endpoints": ["clf"], "rate": rate, "burst": burst},
    }
    return snap


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def checker(**kw) -> tuple[ClientKeys, Clock, list]:
    clock, refused = Clock(), []
    keys = ClientKeys(required=True, clock=clock, on_refusal=lambda *a: refused.append(a))
    keys.apply_snapshot(keys_snapshot(**kw))
    return keys, clock, refused


def test_bucket_lets_burst_then_rate_through_with_retry_after():
    keys, clock, refused = checker(rate=2.0, burst=3)
    assert [keys.check(SLOW, "clf") for _ in range(3)] == ["batch"] * 3
    with pytest.raises(TooManyRequests) as exc:
        keys.check(SLOW, "clf")
    assert exc.value.headers == {"Retry-After": "1"} and "batch" in exc.value.message and "2 requests/s" in exc.value.message
    clock.now += 0.5  # one token at 2/s
    assert keys.check(SLOW, "clf") == "batch"
    with pytest.raises(TooManyRequests):
        keys.check(SLOW, "clf")
    clock.now += 60  # idle: refilled up to the burst only
    assert sum(1 for _ in range(10) if _ok(keys, SLOW, "clf")) == 3
    assert refused[0] == ("clf", "rate", "batch", 429)


def test_slow_rate_retry_after_rounds_up():
    keys, clock, _ = checker(rate=0.1, burst=1)
    keys.check(SLOW, "clf")
    with pytest.raises(TooManyRequests) as exc:
        keys.check(SLOW, "clf")
    assert exc.value.headers["Retry-After"] == "10"


def _ok(keys: ClientKeys, key: str, endpoint: str) -> bool:
    try:
        keys.check(key, endpoint)
        return True
    except ServingError:
        return False


def test_missing_invalid_and_out_of_scope():
    keys, _, refused = checker()
    for key in (None, "", "sk_" + "0" * 64):
        with pytest.raises(Unauthorized) as exc:
            keys.check(key, "clf")
        assert exc.value.headers == {"WWW-Authenticate": "Bearer"}
    with pytest.raises(Forbidden) as exc:
        keys.check(SCOPED, "clf")
    assert exc.value.message == "client key app may not call endpoint 'clf' (it may call: other)"
    assert keys.check(ALL, "anything") == "ops" and keys.check(SCOPED, "other") == "app"
    assert [r[1] for r in refused] == ["missing_key", "missing_key", "invalid_key", "endpoint_scope"]


def test_a_push_keeps_unchanged_buckets_resets_changed_ones_and_drops_revoked_keys():
    keys, clock, _ = checker(rate=1.0, burst=1)
    keys.check(SLOW, "clf")
    keys.apply_snapshot(keys_snapshot(rate=1.0, burst=1))  # same rate: the bucket stays empty
    assert not _ok(keys, SLOW, "clf")
    keys.apply_snapshot(keys_snapshot(rate=5.0, burst=1))  # new rate: a new, full bucket
    assert _ok(keys, SLOW, "clf")
    revoked = keys_snapshot()
    del revoked["client_keys"]["ops"]
    keys.apply_snapshot(revoked)
    with pytest.raises(Unauthorized):
        keys.check(ALL, "clf")


def test_not_required_checks_nothing():
    keys = ClientKeys(required=False)
    keys.apply_snapshot(keys_snapshot())
    assert keys.check(None, "clf") is None and keys.check_authorization("Bearer nonsense", "clf") is None


@pytest.mark.parametrize("header,key", [("Bearer sk_x", "sk_x"), ("bearer  sk_x ", "sk_x"), ("Basic sk_x", None),
                                        ("Bearer", None), (None, None), ("sk_x", None)])
def test_bearer(header, key):
    assert bearer(header) == key


# --- an in-process worker ----------------------------------------------------------------------
def test_every_http_door_checks_keys_and_answers_are_unchanged(make_client, clf_spec, tiny_model):
    plain, plain_recorder = make_client(clf_spec)
    keyed, recorder = make_client(clf_spec, client_keys_required=True)
    events, plain_events = recorder.events, plain_recorder.events
    keyed.app.state.dataplane.keys.apply_snapshot(keys_snapshot(clf_spec))

    # /serve: the ASGI fast path; the answer is the model's, run directly
    body = {"text": TEXT}
    r = keyed.post("/serve/clf", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert without_ids(r) == {"error": "a client key is required: send 'Authorization: Bearer <key>' (serving key create)"}
    r = keyed.post("/serve/clf/1", json=body, headers={"Authorization": f"Bearer {SCOPED}"})
    assert r.status_code == 403 and r.json()["error"].startswith("client key app may not call endpoint 'clf'")
    answer = keyed.post("/serve/clf", json=body, headers={"Authorization": f"Bearer {ALL}"})
    assert answer.status_code == 200 and answer.json() == plain.post("/serve/clf", json=body).json()
    np.testing.assert_allclose(answer.json()["logits"], direct(tiny_model, [TEXT])[0], atol=1e-4)
    assert events[-1]["key"] == "ops" and events[-1]["status"] == 200 and "key" not in plain_events[-1]
    assert {"refused": "missing_key", "status": 401}.items() <= events[0].items()

    # /serve has one door; the OpenAPI document describes it, 401 and 403 included
    described = keyed.get("/openapi.json").json()["paths"]["/serve/{endpoint}"]["post"]["responses"]
    assert {"401", "403", "429"} <= described.keys()

    # /v2: infer, metadata and readiness of a model need a key; server health does not
    v2, v2_headers = request(tokens(tiny_model), binary=False)
    assert keyed.post("/v2/models/clf/infer", content=v2, headers=v2_headers).status_code == 401
    got = keyed.post("/v2/models/clf/infer", content=v2, headers={**v2_headers, "Authorization": f"Bearer {ALL}"})
    assert got.status_code == 200, got.text
    logits = np.asarray(got.json()["outputs"][0]["data"]).reshape(got.json()["outputs"][0]["shape"])
    np.testing.assert_allclose(logits, direct(tiny_model, [TEXT]), atol=1e-4)
    assert events[-1]["key"] == "ops"
    for path in ("/v2/models/clf", "/v2/models/clf/ready", "/v2/models/clf/versions/1", "/v2/models/clf/stats",
                 "/v2/models/clf/versions/1/stats"):
        assert keyed.get(path).status_code == 401, path
        assert keyed.get(path, headers={"Authorization": f"Bearer {SCOPED}"}).status_code == 403, path
        assert keyed.get(path, headers={"Authorization": f"Bearer {ALL}"}).status_code == 200, path
    assert keyed.get("/v2/health/live").status_code == 200 and keyed.get("/v2").status_code == 200
    every = keyed.get("/v2/models/stats", headers={"Authorization": f"Bearer {ALL}"})  # no one endpoint to check
    assert every.status_code == 403 and "/v2/models/{name}/stats" in every.json()["error"]

    # 429 with Retry-After, JSON like every other error of the worker
    slow = {"Authorization": f"Bearer {SLOW}"}
    statuses = [keyed.post("/serve/clf", json=body, headers=slow).status_code for _ in range(6)]
    assert statuses[:3] == [200] * 3 and 429 in statuses[3:]
    r = keyed.post("/serve/clf", json=body, headers=slow)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 and "batch" in r.json()["error"]


def test_keys_off_is_unchanged(make_client, clf_spec):
    client, recorder = make_client(clf_spec)
    events = recorder.events
    client.app.state.dataplane.keys.apply_snapshot(keys_snapshot(clf_spec))
    assert client.post("/serve/clf", json={"text": "hi"}).status_code == 200
    assert client.post("/serve/clf", json={"text": "hi"}, headers={"Authorization": "Bearer junk"}).status_code == 200
    assert client.get("/v2/models/clf").status_code == 200
    assert all("key" not in e and "refused" not in e for e in events)
