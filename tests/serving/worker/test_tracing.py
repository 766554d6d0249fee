"""One trace through the worker (serving/worker/tracing_layer.py, serving/tracing/): a real worker app in
process, its spans exported over OTLP/HTTP to a receiver made with OpenTelemetry's protobuf definitions
(tests/support/otlp.py: no OpenTelemetry Collector can be had here). The client's trace is continued;
the route, preprocess, engine and postprocess spans hang from the request's; the trace id is in the
prediction log's record and, with the request id, in every error body; a malformed traceparent is a 400
in each front end's own shape."""
from __future__ import annotations

import orjson
import pytest

from serving.tracing import spans
from tests.support.otlp import Receiver, children
from tests.support.procs import wait_until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def test_the_clients_trace_is_continued_through_every_hop(make_client, clf_spec, receiver, home):
    client, _ = make_client({**clf_spec, "prediction_log": {"sample": 100}}, tracing_otlp_endpoint=receiver.url)
    r = client.post("/serve/clf", json={"text": "traced"}, headers={"traceparent": GOOD, "X-Request-Id": "t-1"})
    assert r.status_code == 200
    assert spans.flush()
    got = wait_until(lambda: receiver.trace(TRACE) if len(receiver.trace(TRACE)) >= 5 else None, 10, "the spans")
    (server,) = [s for s in got if s.parent_id == PARENT]
    assert server.name == "POST /serve/{endpoint}" and server.service == "serving-worker"
    assert server.attributes["serving.endpoint"] == "clf" and server.attributes["http.status_code"] == 200
    assert server.attributes["serving.request_id"] == "t-1"
    assert [s.name for s in children(got, server)] == ["route", "preprocess", "engine", "postprocess"]
    engine = next(s for s in got if s.name == "engine")
    assert engine.attributes == {"serving.engine": "onnxruntime", "serving.version": 1}
    client.app.state.dataplane.predictions.log.flush(5)
    (record,) = [orjson.loads(line) for f in (home / "predictions").glob("*.jsonl") for line in f.read_bytes().splitlines()]
    assert record["trace_id"] == TRACE and record["request_id"] == "t-1"


def test_an_error_body_names_the_request_and_the_trace(make_client, clf_spec, receiver):
    client, _ = make_client(clf_spec, tracing_otlp_endpoint=receiver.url)
    r = client.post("/serve/clf", json={"no_text": 1}, headers={"X-Request-Id": "t-2"})
    body = r.json()
    assert r.status_code == 422 or r.status_code == 400
    assert body["request_id"] == "t-2" and len(body["trace_id"]) == 32 and "error" in body
    assert spans.flush()
    got = wait_until(lambda: receiver.trace(body["trace_id"]) or None, 10, "the failed request's spans")
    (server,) = [s for s in got if s.parent_id == ""]
    assert server.attributes["http.status_code"] == r.status_code


def test_without_tracing_an_error_body_still_names_the_request(make_client, clf_spec):
    client, _ = make_client(clf_spec)
    body = client.post("/serve/clf", json={"no_text": 1}, headers={"X-Request-Id": "t-3"}).json()
    assert body["request_id"] == "t-3" and "trace_id" not in body


@pytest.mark.parametrize("method,path,body,shape", [
    ("POST", "/serve/clf", {"text": "x"}, lambda j: j["error"]),
    ("POST", "/v2/models/clf/infer", {"inputs": []}, lambda j: j["error"]),
    ("POST", "/serve/openai/v1/completions", {"model": "clf", "prompt": "x"},
     lambda j: j["error"]["message"] if j["error"]["param"] is None and j["error"]["type"] == "invalid_request_error" else None),
    ("POST", "/serve/tei/clf/embed", {"inputs": "x"}, lambda j: j["error"] if j["error_type"] == "Validation" else None),
    ("POST", "/predictions/clf", None, lambda j: j["message"] if j["code"] == 400 else None),
])
def test_a_malformed_traceparent_is_a_400_in_each_front_ends_shape(make_client, clf_spec, method, path, body, shape):
    client, _ = make_client(clf_spec)
    r = client.request(method, path, json=body, headers={"traceparent": "00-nope-01"})
    assert r.status_code == 400, r.text
    assert "traceparent '00-nope-01' is not a W3C trace context" in shape(r.json()), r.json()
    assert r.headers["X-Request-Id"]
