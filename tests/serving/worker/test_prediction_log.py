"""The prediction log through a real worker app (FastAPI's TestClient) over a real onnxruntime engine:
the record of each sampled request holds what the client sent and exactly what it got, on /serve and on
v2; failed requests are logged with the error the client was told; a shadow's answer is logged beside
the live one under the same request id; sampling keeps the asked share; nothing when it is off."""
from __future__ import annotations

import time

import orjson
import pytest

from tests.serving.worker.support import endpoint_spec
from tests.support.procs import wait_until


def records(home) -> list[dict]:
    return [orjson.loads(line) for f in sorted((home / "predictions").glob("*.jsonl"))
            for line in f.read_bytes().splitlines()]


def logged(spec: dict, **settings) -> dict:
    return {**spec, "prediction_log": {"sample": 100, **settings}}


@pytest.fixture
def clf(tiny_model, store, tmp_path):
    return endpoint_spec("clf", tiny_model, store, tmp_path)


def test_serve_and_v2_records_hold_the_inputs_and_exactly_the_answer(make_client, clf, home):
    client, _ = make_client(logged(clf))
    r = client.post("/serve/clf", json={"text": "a fine day"}, headers={"X-Request-Id": "req-1"})
    assert r.status_code == 200
    ids = [[101, 2000, 2001, 102]]
    v2 = client.post("/v2/models/clf/infer", headers={"X-Request-Id": "req-2"}, json={"inputs": [
        {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64", "data": [[1, 1, 1, 1]]},
        {"name": "token_type_ids", "shape": [1, 4], "datatype": "INT64", "data": [[0, 0, 0, 0]]}]})
    assert v2.status_code == 200, v2.text
    assert client.app.state.dataplane.predictions.log.flush(5)
    by_id = {rec["request_id"]: rec for rec in records(home)}
    serve = by_id["req-1"]
    assert serve["inputs"] == {"text": "a fine day"} and serve["outputs"] == r.json()
    assert (serve["endpoint"], serve["version"], serve["status"], serve["shadow"]) == ("clf", 1, 200, False)
    tensors = by_id["req-2"]
    assert tensors["inputs"]["input_ids"] == {"dtype": "int64", "shape": [1, 4], "data": ids}
    (logits,) = [o for o in v2.json()["outputs"]]
    got = tensors["outputs"][logits["name"]]
    assert got["shape"] == logits["shape"] and [v for row in got["data"] for v in row] == logits["data"], \
        "the logits the client got, bit for bit (float32 both ways)"


def test_a_failed_request_is_logged_with_the_error_the_client_got(make_client, clf, home):
    client, _ = make_client(logged(clf))
    r = client.post("/serve/clf", json={"no_text": 1}, headers={"X-Request-Id": "bad-1"})
    assert 400 <= r.status_code < 500
    assert client.app.state.dataplane.predictions.log.flush(5)
    (rec,) = [x for x in records(home) if x["request_id"] == "bad-1"]
    assert rec["status"] == r.status_code and rec["error"] == r.json()["error"]
    assert rec["inputs"] == {"no_text": 1} and "outputs" not in rec


def test_a_shadows_answer_is_logged_beside_the_live_one(make_client, tiny_model, store, tmp_path, home):
    spec = endpoint_spec("clf", tiny_model, store, tmp_path, versions=((1, 100.0), (2, 100.0)))
    spec["targets"][1]["role"] = "shadow"
    client, recorder = make_client(logged(spec))
    r = client.post("/serve/clf", json={"text": "copied"}, headers={"X-Request-Id": "both"})
    assert r.status_code == 200
    log = client.app.state.dataplane.predictions.log
    wait_until(lambda: log.flush(1) and len([x for x in records(home) if x["request_id"] == "both"]) == 2, 10,
               "the live and the shadow record")
    live, shadow = sorted((x for x in records(home) if x["request_id"] == "both"), key=lambda x: x["shadow"])
    assert (live["version"], live["shadow"], shadow["version"], shadow["shadow"]) == (1, False, 2, True)
    assert shadow["inputs"] == live["inputs"] == {"text": "copied"}
    assert shadow["outputs"] == live["outputs"] == r.json(), "the same model file: the same answer"


def test_sampling_keeps_the_asked_share_and_off_keeps_nothing(make_client, clf, home):
    client, _ = make_client(logged(clf, sample=30))
    n = 300
    for i in range(n):
        assert client.post("/serve/clf", json={"text": "x"}).status_code == 200
    assert client.app.state.dataplane.predictions.log.flush(5)
    kept = len(records(home))
    # Binomial(300, 0.3): mean 90, sd 7.9; 5 sd either side
    assert abs(kept - 90) <= 5 * 7.94, kept
    client2, _ = make_client(clf, prediction_log_dir=home / "off")
    client2.post("/serve/clf", json={"text": "x"})
    time.sleep(0.3)
    assert not (home / "off").exists()


def test_status_shows_the_sink_and_its_counts(make_client, clf):
    client, _ = make_client(logged(clf))
    client.post("/serve/clf", json={"text": "x"})
    client.app.state.dataplane.predictions.log.flush(5)
    status = client.get("/status").json()["prediction_log"]
    assert status == {"sink": "files", "queued": 0, "written": 1, "dropped": 0, "sink_error": None}


def test_a_body_that_cannot_be_read_is_logged_without_inputs(make_client, clf, home):
    client, _ = make_client(logged(clf))
    r = client.post("/serve/clf", content=b"{not json", headers={"X-Request-Id": "unreadable",
                                                                  "Content-Type": "application/json"})
    assert r.status_code == 400
    assert client.app.state.dataplane.predictions.log.flush(5)
    (rec,) = [x for x in records(home) if x["request_id"] == "unreadable"]
    assert rec["status"] == 400 and rec["inputs"] is None and rec["version"] is None
