"""Every answer carries its request's id (serving/worker/request_ids.py): the client's own X-Request-Id
when usable, else a new one, the same in the request's statistics event; on answers, errors of every
front end, and requests refused before the data plane, over a real worker app (FastAPI's TestClient)."""
from __future__ import annotations

import re

import pytest

from serving.worker.request_ids import MAX_LENGTH

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def test_a_new_id_is_returned_and_is_the_events(make_client, clf_spec):
    client, recorder = make_client(clf_spec)
    r = client.post("/serve/clf", json={"text": "fine"})
    assert r.status_code == 200 and re.fullmatch(UUID, r.headers["X-Request-Id"])
    assert [e["request_id"] for e in recorder.events] == [r.headers["X-Request-Id"]]
    again = client.post("/serve/clf", json={"text": "fine"})
    assert again.headers["X-Request-Id"] != r.headers["X-Request-Id"]


def test_the_clients_own_id_is_kept_on_the_answer_and_in_the_event(make_client, clf_spec):
    client, recorder = make_client(clf_spec)
    mine = "trace-4bf92f3577b34da6a3ce929d0e0e4736/span:1"
    r = client.post("/serve/clf", json={"text": "fine"}, headers={"X-Request-Id": mine})
    assert r.headers["X-Request-Id"] == mine and recorder.events[-1]["request_id"] == mine
    r = client.post("/v2/models/clf/infer", json={"inputs": []}, headers={"X-Request-Id": mine})  # a refusal
    assert r.status_code == 400 and r.headers["X-Request-Id"] == mine


@pytest.mark.parametrize("given", ["x" * (MAX_LENGTH + 1), "two words", "tab\there"])
def test_an_unusable_id_is_replaced_not_refused(make_client, clf_spec, given):
    client, recorder = make_client(clf_spec)
    r = client.post("/serve/clf", json={"text": "fine"}, headers={"X-Request-Id": given})
    assert r.status_code == 200 and re.fullmatch(UUID, r.headers["X-Request-Id"])
    assert recorder.events[-1]["request_id"] == r.headers["X-Request-Id"]


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/serve/nope", {"text": "x"}, 404),                                  # /serve: unknown endpoint
    ("POST", "/serve/openai/v1/completions", {"model": "nope", "prompt": "a"}, 404),  # OpenAI's shape
    ("POST", "/serve/tei/nope/embed", {"inputs": "a"}, 404),                       # TEI's
    ("POST", "/predictions/nope", None, 404),                                      # TorchServe's
    ("GET", "/no/such/route", None, 404),                                          # no route at all
])
def test_every_front_ends_errors_carry_an_id(make_client, clf_spec, method, path, body, status):
    client, _ = make_client(clf_spec)
    r = client.request(method, path, json=body)
    assert r.status_code == status and re.fullmatch(UUID, r.headers["X-Request-Id"]), r.text
