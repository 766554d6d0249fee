"""Real TorchServe 0.12.0 (tests/support/torchserve.py) serving each archive kind of archives.py.

This module proves the harness and writes down what real TorchServe answers, since the platform's
``/predictions/{name}`` must answer the same. Observed here (TorchServe 0.12.0, Java 17, CPU):

Answers (HTTP/1.1):
- success: status 200, NO ``Content-Type`` header (unless the handler sets one), body
  ``json.dumps(answer, indent=2)`` with no trailing newline (bytes and str answers go out as they are,
  per ts/protocol/otf_message_handler.py),
  headers ``x-request-id`` (a UUID), ``pragma: no-cache``,
  ``cache-control: no-cache; no-store, must-revalidate, private``,
  ``expires: Thu, 01 Jan 1970 00:00:00 UTC``, ``content-length``, ``connection: keep-alive``;
- error: ``Content-Type: application/json``, body ``json.dumps({"code", "type", "message"}, indent=2) + "\\n"``,
  the same cache headers, ``connection: close`` (TorchServe closes the connection after an error):
  - unknown model: 404 ``ModelNotFoundException`` "Model not found: {name}" (any method);
  - unknown version: 404 ``ModelVersionNotFoundException`` "Model version: {v} does not exist for model: {name}";
  - unknown path (``/nothing``, ``/models`` on the inference port): 404 ``ResourceNotFoundException``
    "Requested resource is not found, please refer to API document.";
  - the handler raises: 503 ``InternalServerException`` "Prediction failed" (also a non-image body to an
    image handler, and every request to the built-in base_handler without a service envelope); per
    ts/service.py, a MemoryError (or an exception whose text says CUDA) gives 507 "Out of resources" and
    ts.utils.util.PredictionException(message, code) gives its own code and message;
  - responseTimeout passed: 500 ``InternalServerException`` "Worker died." after responseTimeout seconds
    (not at once); TorchServe kills that worker and starts another (new pid, ~3 s here), and the next
    request waits for it and succeeds.
- a batch with one failing request: EVERY request of that batch gets the 503 "Prediction failed"; the
  worker lives on (same pid) and answers the next batch.
- GET, PUT and DELETE on /predictions/{name} reach the handler as POST does (GET/DELETE with an empty body).

What a handler is handed (``data`` is a list, one dict per request; the function handler echoes it):
- raw body, no Content-Type (POST, or PUT as ``curl -T`` sends): ``{"body": bytearray}``, field content type "";
- the frontend drops a Content-Type's parameters (``application/json; charset=utf-8`` -> ``application/json``)
  and keeps its case; the backend then decodes case-sensitively:
  - ``application/json``: ``{"body": json.loads(body)}`` (any JSON value; ``null`` -> None); a body that
    is not JSON (or empty) stays a bytearray; ``Application/JSON`` is not decoded;
  - ``text/...``: ``{"body": str}`` (utf-8); ``TEXT/plain`` stays a bytearray;
  - anything else (octet-stream, image/png): a bytearray, the field content type being the type sent;
- multipart/form-data and application/x-www-form-urlencoded: one key per form field, by its name (no
  "body"); a file part (one with a filename) has its own content type (parameters dropped) and is
  decoded by it as above; a plain field (no filename, or urlencoded) is a bytearray with content type ""
  whatever the part says; a repeated field name: the last part wins;
- the query string never reaches the handler (GET ?x=1 gives an empty bytearray body);
- request headers: ``context.get_all_request_header(idx)`` holds them with the case the client sent,
  plus per-field ``{"content-type": ...}`` dicts, ``url_path`` (what follows /predictions/{name}/{version}/,
  "" usually) and ``explain`` ("False" on /predictions whatever the client sent, "True" on /explanations).
Built-in handlers read ``row.get("data") or row.get("body")``: a multipart image must be the field
``data``. The text_classifier reads only the first request of a batch.

The image kinds need ``serving.torchserve.vision_ops`` (torchvision cannot import in this venv without
it); until that module exists their tests cannot run.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import psutil
import pytest

from tests.serving.torchserve.archives import (
    CLASSIFIER_LABELS, IMAGE_KINDS, SLOW_TIMEOUT_S, Archive, session_archives,
)
from tests.support.ci import cannot_run
from tests.support.torchserve import TorchServe, torchserve

VISION_OPS = "serving.torchserve.vision_ops"
START_LIMIT_S = 60.0


def _vision_ops_present() -> bool:
    try:
        return importlib.util.find_spec(VISION_OPS) is not None
    except ModuleNotFoundError:
        return False


def error_body(code: int, kind: str, message: str) -> bytes:
    """TorchServe's error body, byte for byte."""
    return (json.dumps({"code": code, "type": kind, "message": message}, indent=2) + "\n").encode()


def answer_body(answer: Any) -> bytes:
    """TorchServe's body for a handler's JSON-able answer, byte for byte."""
    return json.dumps(answer, indent=2).encode()


CACHE_HEADERS = {"pragma": "no-cache", "cache-control": "no-cache; no-store, must-revalidate, private",
                 "expires": "Thu, 01 Jan 1970 00:00:00 UTC"}


def assert_error(answer: httpx.Response, code: int, kind: str, message: str) -> None:
    assert (answer.status_code, answer.json()) == (code, {"code": code, "type": kind, "message": message}), answer.text
    assert answer.content == error_body(code, kind, message)
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close"
    assert {k: answer.headers[k] for k in CACHE_HEADERS} == CACHE_HEADERS


def assert_success(answer: httpx.Response) -> Any:
    """200, TorchServe's indented JSON with no Content-Type; the decoded answer."""
    assert answer.status_code == 200, answer.text
    assert "content-type" not in answer.headers
    assert answer.headers["connection"] == "keep-alive" and answer.headers["x-request-id"]
    value = answer.json()
    assert answer.content == answer_body(value)
    return value


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Archive]:
    return session_archives(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tmp_path_factory, archives, request) -> Iterator[TorchServe]:
    """One TorchServe with every archive registered (four registrations at a time: each starts a
    Python worker, which imports torch). Image archives only when vision_ops exists. Its logs go to
    the terminal when a test of the module failed."""
    failed_before = request.session.testsfailed
    with torchserve(tmp_path_factory.mktemp("torchserve"), extra_config={"model_metrics_auto_detect": "true"}) as ts:
        kinds = [a for a in archives.values() if a.kind not in IMAGE_KINDS or _vision_ops_present()]
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda archive: ts.register(archive.mar, **archive.register), kinds))
        ts.registered["(all, 4 at a time)"] = time.monotonic() - started
        yield ts
        if request.session.testsfailed > failed_before:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            reporter.write_line(f"\nTorchServe's logs (a test in {__name__} failed):\n{ts.log_tail()}")


def post(ts: TorchServe, name: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(ts.predictions_url(name), timeout=60.0, **kwargs)


def require_vision(server: TorchServe, kind: str) -> None:
    if not _vision_ops_present():
        cannot_run(f"{VISION_OPS} is missing: torchvision cannot import in TorchServe's workers, so the "
                   f"{kind} archive is not registered")


# ------------------------------------------------------------------------------------------- harness


def test_starts_fast_and_registers_every_kind(server, archives, capsys):
    """Start and registration times (printed), and the archives' model-config.yaml settings as
    TorchServe took them."""
    with capsys.disabled():
        print(f"\nTorchServe started in {server.start_s:.1f} s; registration (s): "
              + ", ".join(f"{name} {seconds:.1f}" for name, seconds in server.registered.items()))
    assert server.start_s < START_LIMIT_S
    models = httpx.get(f"{server.management_url}/models", timeout=30).json()["models"]
    expected = {a.name for a in archives.values() if a.kind not in IMAGE_KINDS or _vision_ops_present()}
    assert {m["modelName"] for m in models} == expected
    batched = server.describe("batched")[0]
    assert (batched["batchSize"], batched["maxBatchDelay"], batched["responseTimeout"]) == (4, 200, 5)
    assert server.describe("slow")[0]["responseTimeout"] == SLOW_TIMEOUT_S
    assert server.describe("function")[0]["batchSize"] == 1  # TorchServe's default
    for name in expected:
        assert [w["status"] for w in server.describe(name)[0]["workers"]] == ["READY"]


def test_stopping_leaves_no_process(tmp_path, archives):
    """A second instance, stopped: no Java, CLI or worker process of it remains, and TorchServe stopped
    on SIGTERM (nothing needed SIGKILL). Also shows the built-in base_handler working, which needs a
    service envelope (a server-wide setting): with ``service_envelope=body`` the handler gets the bodies."""
    inputs = archives["base_handler"].inputs
    with torchserve(tmp_path / "ts", extra_config={"service_envelope": "body"}) as ts:
        ts.register(archives["base_handler"].mar)
        one = assert_success(post(ts, "base_handler", json=inputs["row"]))
        assert len(one) == 2 and all(isinstance(v, float) for v in one)  # model(tensor([1, 2, 3])).tolist()
        two = assert_success(post(ts, "base_handler", json=inputs["rows"]))
        assert [len(row) for row in two] == [2, 2] and two[0] == one
        procs = ts.processes()
        assert len(procs) >= 3  # the CLI, Java, the worker
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not ts.processes()
    assert ts.killed == []


# ------------------------------------------------------------------------------- how requests arrive


def echo(server: TorchServe, method: str = "POST", url: str | None = None, **kwargs: Any) -> dict:
    """What the function archive's handler was handed for this request."""
    answer = httpx.request(method, url or server.predictions_url("function"), timeout=60.0, **kwargs)
    return assert_success(answer)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_raw_body_post_and_put_arrive_as_bytearray_body(server, archives):
    raw = archives["function"].inputs["png"]
    for method in ("POST", "PUT"):  # PUT is what `curl -T file URL` sends
        got = echo(server, method, content=raw)
        assert got["fields"] == {"body": {"type": "bytearray", "base64": b64(raw)}}
        assert got["field_content_types"] == {"body": ""} and got["request_content_type"] is None
        assert got["model"] == "function" and got["batch_size"] == 1
        assert "explain" in got["header_names"] and "url_path" in got["header_names"]
    assert echo(server, "GET")["fields"] == {"body": {"type": "bytearray", "base64": ""}}
    assert echo(server, "DELETE")["fields"] == {"body": {"type": "bytearray", "base64": ""}}


def test_json_and_text_bodies_are_decoded_by_content_type(server, archives):
    value = archives["function"].inputs["json"]
    body = json.dumps(value).encode()

    def send(content: bytes, content_type: str) -> dict:
        return echo(server, content=content, headers={"content-type": content_type})

    got = echo(server, json=value)
    assert got["fields"] == {"body": {"type": "dict", "value": value}}
    assert got["field_content_types"] == {"body": "application/json"}
    assert got["request_content_type"] == "application/json"
    with_charset = send(body, "application/json; charset=utf-8")
    assert with_charset["fields"]["body"] == {"type": "dict", "value": value}  # the frontend drops parameters
    assert with_charset["field_content_types"] == {"body": "application/json"}
    upper = send(body, "Application/JSON")  # the backend compares case-sensitively
    assert upper["fields"]["body"]["type"] == "bytearray"
    assert upper["field_content_types"] == {"body": "Application/JSON"}
    not_json = send(b"{not json", "application/json")
    assert not_json["fields"]["body"] == {"type": "bytearray", "base64": b64(b"{not json")}
    assert send(b"", "application/json")["fields"]["body"]["type"] == "bytearray"
    assert send(b"null", "application/json")["fields"]["body"] == {"type": "NoneType", "value": None}
    assert echo(server, json=[1, 2])["fields"]["body"] == {"type": "list", "value": [1, 2]}
    text = send("héllo".encode(), "text/plain; charset=utf-8")
    assert text["fields"] == {"body": {"type": "str", "value": "héllo"}}
    assert text["field_content_types"] == {"body": "text/plain"}
    assert send(b"x", "TEXT/plain")["fields"]["body"]["type"] == "bytearray"
    octets = send(b"x", "application/octet-stream")
    assert octets["fields"]["body"]["type"] == "bytearray"
    assert octets["field_content_types"] == {"body": "application/octet-stream"}


def test_query_path_and_pseudo_headers(server):
    """The query string never reaches the handler; ``url_path`` is what follows
    /predictions/{name}/{version}/; ``explain`` is "False" on /predictions (a client's own ``explain``
    header is overridden), "True" on /explanations."""
    got = echo(server, content=b"q", params={"x": "1"}, headers={"explain": "True"})
    assert got["fields"] == {"body": {"type": "bytearray", "base64": b64(b"q")}}
    assert (got["url_path"], got["explain"]) == ("", "False")
    deeper = echo(server, url=server.predictions_url("function", "1.0") + "/extra/path", content=b"q")
    assert deeper["url_path"] == "extra/path"
    assert echo(server, url=f"{server.inference_url}/explanations/function", content=b"q")["explain"] == "True"


def test_multipart_fields_arrive_by_name(server, archives):
    png = archives["function"].inputs["png"]
    got = echo(server, data={"note": "plain field"},
               files={"data": ("seven.png", png, "image/png"), "meta": ("m.json", b'{"k": 2}', "application/json"),
                      "words": ("w.txt", b"some words", "text/plain; charset=utf-8"),
                      "unnamed": (None, b'{"k": 3}', "application/json")})
    assert got["fields"] == {
        "note": {"type": "bytearray", "base64": b64(b"plain field")},
        "data": {"type": "bytearray", "base64": b64(png)},
        "meta": {"type": "dict", "value": {"k": 2}},
        "words": {"type": "str", "value": "some words"},
        # a part without a filename is a plain form field: its own content type is ignored
        "unnamed": {"type": "bytearray", "base64": b64(b'{"k": 3}')},
    }
    assert got["field_content_types"] == {"note": "", "data": "image/png", "meta": "application/json",
                                          "words": "text/plain", "unnamed": ""}
    assert got["request_content_type"].startswith("multipart/form-data; boundary=")
    twice = echo(server, files=[("data", ("a.bin", b"1", "application/octet-stream")),
                                ("data", ("b.bin", b"2", "application/octet-stream"))])
    assert twice["fields"] == {"data": {"type": "bytearray", "base64": b64(b"2")}}  # the last part wins


def test_urlencoded_form_fields_arrive_by_name(server):
    got = echo(server, data={"a": "1", "b": "two"})
    assert got["fields"] == {"a": {"type": "bytearray", "base64": b64(b"1")},
                             "b": {"type": "bytearray", "base64": b64(b"two")}}
    assert got["field_content_types"] == {"a": "", "b": ""}


# ------------------------------------------------------------------------------------ handler kinds


def test_subclass_answers_a_json_object_per_request(server, archives):
    values = archives["subclass"].inputs["values"]
    got = assert_success(post(server, "subclass", json=values))
    assert set(got) == {"scores", "best"} and len(got["scores"]) == 2 and got["best"] in (0, 1)
    assert assert_success(post(server, "subclass", content=json.dumps(values).encode())) == got  # parsed by the handler


def test_text_classifier_answers_every_label(server, archives):
    inputs = archives["text_classifier"].inputs
    answers = {name: assert_success(post(server, "text_classifier", content=text)) for name, text in inputs.items()}
    for got in answers.values():
        assert list(got) == ["negative", "neutral", "positive", "question"]
        assert abs(sum(got.values()) - 1.0) < 1e-5
    assert answers["review"] != answers["question"]
    as_text = post(server, "text_classifier", content=inputs["review"], headers={"content-type": "text/plain"})
    assert assert_success(as_text) == answers["review"]


def test_base_handler_without_envelope_fails_every_request(server, archives):
    """The built-in base_handler's preprocess is torch.as_tensor(list of request dicts): it raises."""
    for body in archives["base_handler"].inputs.values():
        assert_error(post(server, "base_handler", json=body), 503, "InternalServerException", "Prediction failed")


def test_requirements_archive_loads_without_installing(server):
    assert assert_success(post(server, "requirements", json={"x": 1})) == {"newer": "1.10"}


def test_custom_metrics_reach_prometheus(server):
    """With model_metrics_auto_detect=true a handler's own metrics appear on /metrics, labelled with
    their dimensions (ModelName and Level added by TorchServe) and Hostname."""
    assert assert_success(post(server, "metrics", json={"x": 1})) == {"counted": 1}
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    lines = [line for line in text.splitlines() if line.startswith("Probe")]
    assert any(line.startswith('ProbeRequests{Probe="metrics",ModelName="metrics",Level="Model",') for line in lines)
    assert any(line.startswith('ProbeWorkTime{ModelName="metrics",Level="Model",') and line.endswith(" 1.5")
               for line in lines), lines
    assert any(line.startswith('ProbeBatchSize{ModelName="metrics",') for line in lines), lines
    assert "# TYPE ProbeRequests counter" in text and "# TYPE ProbeWorkTime gauge" in text


# ------------------------------------------------------------------------------------------ batching


def concurrently(bodies: list[Any], url: str) -> list[httpx.Response]:
    """POST each JSON body at once: clients made first, requests released together (a barrier), so that
    they arrive within the batch delay and meet in one batch."""
    barrier = threading.Barrier(len(bodies))
    clients = [httpx.Client(timeout=60.0) for _ in bodies]

    def one(i: int) -> httpx.Response:
        barrier.wait()
        return clients[i].post(url, json=bodies[i])

    try:
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            return list(pool.map(one, range(len(bodies))))
    finally:
        for client in clients:
            client.close()


def test_concurrent_requests_share_a_batch(server):
    got = [assert_success(a) for a in concurrently([{"value": i} for i in range(4)], server.predictions_url("batched"))]
    assert [g["value"] for g in got] == [0, 1, 2, 3] and [g["scaled"] for g in got] == [0, 3, 6, 9]
    assert max(g["batch_size"] for g in got) > 1, got
    assert assert_success(post(server, "batched", json={"value": 5}))["batch_size"] == 1  # alone, after 200 ms


def test_a_failing_request_fails_its_whole_batch(server, archives):
    """Every request batched with the poison one gets its 503 (all four, when they meet in one batch as
    they do here); the worker survives."""
    pid = server.worker_pids("batched")
    bodies = [{"value": 1}, archives["batched"].inputs["poison"], {"value": 3}, {"value": 4}]
    answers = concurrently(bodies, server.predictions_url("batched"))
    assert_error(answers[1], 503, "InternalServerException", "Prediction failed")
    failed = [a for a in answers if a.status_code != 200]
    for answer in failed:
        assert_error(answer, 503, "InternalServerException", "Prediction failed")
    assert len(failed) > 1, [a.text for a in answers]  # a healthy request shared the poison's fate
    assert all(assert_success(a)["batch_size"] <= 4 - len(failed) for a in answers if a.status_code == 200)
    assert server.worker_pids("batched") == pid
    assert assert_success(post(server, "batched", json={"value": 2}))["scaled"] == 6


# -------------------------------------------------------------------------------------------- errors


def test_unknown_model_version_and_path(server):
    unknown = "Model not found: no_such_model"
    assert_error(post(server, "no_such_model", content=b"x"), 404, "ModelNotFoundException", unknown)
    assert_error(httpx.get(server.predictions_url("no_such_model"), timeout=30), 404, "ModelNotFoundException", unknown)
    assert_error(httpx.post(server.predictions_url("function", "9.9"), content=b"x", timeout=30), 404,
                 "ModelVersionNotFoundException", "Model version: 9.9 does not exist for model: function")
    assert echo(server, url=server.predictions_url("function", "1.0"), content=b"x")["model"] == "function"
    message = "Requested resource is not found, please refer to API document."
    for path in ("/nothing", "/models"):
        assert_error(httpx.get(server.inference_url + path, timeout=30), 404, "ResourceNotFoundException", message)
    ping = httpx.get(server.inference_url + "/ping", timeout=30)
    assert (ping.status_code, ping.headers["content-type"]) == (200, "application/json")
    assert ping.content == b'{\n  "status": "Healthy"\n}\n'


def test_response_timeout_kills_the_worker(server, archives):
    inputs = archives["slow"].inputs
    assert assert_success(post(server, "slow", json=inputs["fast"])) == {"slept": 0}
    before = server.worker_pids("slow")
    started = time.monotonic()
    assert_error(post(server, "slow", json=inputs["too_slow"]), 500, "InternalServerException", "Worker died.")
    waited = time.monotonic() - started
    assert SLOW_TIMEOUT_S - 0.5 < waited < inputs["too_slow"]["sleep"], waited
    assert assert_success(post(server, "slow", json=inputs["fast"])) == {"slept": 0}  # waits for the new worker
    after = server.worker_pids("slow")
    assert after and after != before


# -------------------------------------------------------------------------------------------- images


def test_image_classifier_answers_top5_class_names(server, archives):
    require_vision(server, "image_classifier")
    inputs = archives["image_classifier"].inputs
    names = {value[-1] if isinstance(value, list) else value for value in CLASSIFIER_LABELS.values()}
    for image in inputs.values():
        got = assert_success(post(server, "image_classifier", content=image))
        assert len(got) == 5 and set(got) <= names
        assert list(got.values()) == sorted(got.values(), reverse=True)
    jpeg = assert_success(post(server, "image_classifier", content=inputs["jpeg"]))
    as_form = assert_success(post(server, "image_classifier", files={"data": ("a.jpg", inputs["jpeg"], "image/jpeg")}))
    as_put = assert_success(httpx.put(server.predictions_url("image_classifier"), content=inputs["jpeg"], timeout=60))
    assert as_form == as_put == jpeg
    failed = ("InternalServerException", "Prediction failed")
    assert_error(post(server, "image_classifier", content=b"not an image"), 503, *failed)
    # built-in handlers read only the field "data" (or "body") of a form
    assert_error(post(server, "image_classifier", files={"picture": ("a.jpg", inputs["jpeg"], "image/jpeg")}), 503,
                 *failed)


def test_mnist_answers_a_digit(server, archives):
    require_vision(server, "mnist")
    for png in archives["mnist"].inputs.values():
        answer = post(server, "mnist", content=png)
        digit = assert_success(answer)
        assert isinstance(digit, int) and 0 <= digit <= 9 and answer.content == str(digit).encode()


def test_image_segmenter_answers_a_class_grid(server, archives):
    require_vision(server, "image_segmenter")
    got = assert_success(post(server, "image_segmenter", content=archives["image_segmenter"].inputs["jpeg"]))
    assert len(got) == 14 and all(len(row) == 14 for row in got)
    cells = [cell for row in got for cell in row]
    assert all(len(c) == 2 and c[0] in (0.0, 1.0, 2.0, 3.0) and 0.25 <= c[1] <= 1.0 for c in cells)


def test_object_detector_answers_labelled_boxes_over_threshold(server, archives):
    require_vision(server, "object_detector")
    got = assert_success(post(server, "object_detector", content=archives["object_detector"].inputs["png"]))
    assert len(got) == 2, got  # the archive is calibrated so: two of four cells score >= 0.5
    for box in got:
        (label, coords), = [(k, v) for k, v in box.items() if k != "score"]
        assert label in ("circle", "square", "triangle") and len(coords) == 4 and box["score"] >= 0.5
