"""Every archive kind answers through the platform's `/predictions` exactly as real TorchServe answers it.

Real TorchServe 0.12 (tests/support/torchserve.py: the `torchserve` package on Debian's Java) and the
platform (control plane, statistics service and a worker, as processes) serve the same archives
(tests/serving/torchserve/archives.py); each test sends both the same request and compares the answers:
the same status and JSON, numbers within 1e-5. Where the platform answers differently on purpose (a
handler that raises, a timeout), the test says so and checks both sides. The CLI path (`serving model
upload` + `model add`, `curl -T` as TorchServe's READMEs type it) is exercised on mnist; the other
archives are registered through the control plane's API, which the CLI calls.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import pytest

from tests.serving.stack import Stack, make_stack
from serving.ports import free_port
from tests.serving.torchserve.archives import Archive, session_archives
from tests.serving.torchserve.test_reference_harness import concurrently
from tests.support.torchserve import TorchServe, torchserve
from tests.support.error_bodies import without_ids

pytestmark = pytest.mark.timeout(900)

COMPARED = ("mnist", "image_classifier", "image_segmenter", "object_detector", "text_classifier", "subclass",
            "batched", "metrics", "function")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Archive]:
    return session_archives(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, archives) -> Iterator[TorchServe]:
    with torchserve(tmp_path_factory.mktemp("ts-reference"), extra_config={"model_metrics_auto_detect": "true"}) as ts:
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(lambda kind: ts.register(archives[kind].mar, **archives[kind].register),
                          [*COMPARED, "slow"]))
        yield ts


@pytest.fixture(scope="module")
def platform(tmp_path_factory, archives) -> Iterator[Stack]:
    stack = make_stack(tmp_path_factory.mktemp("ts-platform"), workers=1)
    stack.env["SERVING_INSTALL_PY_DEP_PER_MODEL"] = "true"  # the requirements archive installs per model
    stack.env["SERVING_TORCHSERVE_MANAGEMENT_PORT"] = str(free_port())  # TorchServe's management API
    stack.env["SERVING_TORCHSERVE_MODEL_STORE"] = str(copy_into(archives["function"].mar, stack.home / "store").parent)
    try:
        stack.start_components(statistics=True)
        stack.cli("model", "upload", "--name", "mnist", "--path", str(archives["mnist"].mar))
        stack.cli("model", "add", "--endpoint", "mnist", "--model", "mnist")
        with stack.api() as api:
            for kind in [*COMPARED, "slow", "requirements"]:
                if kind != "mnist":
                    _register(api, archives[kind])
            for kind in [*COMPARED, "slow", "requirements"]:
                _wait_ready(api, archives[kind].name)
        yield stack
    finally:
        stack.stop_all()


def copy_into(mar: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(mar, folder / mar.name))


def _register(api: httpx.Client, archive: Archive) -> None:
    sha = api.post("/artifacts", content=archive.mar.read_bytes()).json()["sha256"]
    model = api.post("/models", json={"name": archive.name, "artifact": sha, "framework": "torchserve"})
    assert model.status_code == 201, model.text
    deployed = api.post("/endpoints", json={"endpoint": archive.name, "model": archive.name})
    assert deployed.status_code in (200, 201) and deployed.json()["engine"] == "torchserve", deployed.text


def _wait_ready(api: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = api.get(f"/endpoints/{name}/status", params={"wait": 30}, timeout=40).json()
        if status["state"] == "ready":
            return
        assert status["state"] != "failed", status
    raise AssertionError(f"{name} did not get ready: {status}")


def ours(stack: Stack, name: str, suffix: str = "") -> str:
    return f"{stack.worker_url()}/predictions/{name}{suffix}"


def send(url: str, value: Any, form: bool = False, method: str = "PUT") -> httpx.Response:
    """Bytes as `curl -T` sends them (PUT, no content type) or as the form field `data`; JSON values as
    an `application/json` body."""
    if form:
        return httpx.post(url, files={"data": ("input.bin", value, "application/octet-stream")}, timeout=60)
    if isinstance(value, (bytes, bytearray)):
        return httpx.request(method, url, content=value, timeout=60)
    return httpx.post(url, json=value, timeout=60)


def same(a: Any, b: Any, path: str = "") -> None:
    """Equal JSON, numbers within TOLERANCE."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), f"{path}: {a!r} != {b!r}"
        assert math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b) if isinstance(b, dict) else b}"
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _comparable(kind: str, answer: Any) -> Any:
    """The function handler echoes what it was handed, headers too: the headers each server adds differ
    (TorchServe keeps the client's case, uvicorn lower-cases; request ids), the request's own do not."""
    if kind != "function":
        return answer
    return {k: v for k, v in answer.items() if k not in ("header_names", "request_id", "headers")}


def _inputs(archives: dict[str, Archive]) -> list[tuple[str, str, Any]]:
    return [(kind, name, value) for kind in COMPARED for name, value in archives[kind].inputs.items()
            if not (kind == "batched" and name == "poison")]


def test_every_kind_answers_as_torchserve(platform, reference, archives):
    compared = 0
    for kind, name, value in _inputs(archives):
        model = archives[kind].name
        theirs, mine = send(reference.predictions_url(model), value), send(ours(platform, model), value)
        assert mine.status_code == theirs.status_code == 200, (kind, name, mine.text, theirs.text)
        assert mine.headers.get("content-type") == theirs.headers.get("content-type"), (kind, name)
        same(_comparable(kind, theirs.json()), _comparable(kind, mine.json()), f"{kind}/{name}")
        compared += 1
    assert compared >= 15, compared


@pytest.mark.parametrize("kind", ["mnist", "image_classifier", "object_detector"])
def test_multipart_form_data_as_torchserve(platform, reference, archives, kind):
    archive = archives[kind]
    image = next(v for v in archive.inputs.values() if isinstance(v, bytes))
    theirs = send(reference.predictions_url(archive.name), image, form=True)
    mine = send(ours(platform, archive.name), image, form=True)
    assert theirs.status_code == mine.status_code == 200, mine.text
    same(theirs.json(), mine.json(), kind)


def test_curl_as_torchserves_readme_types_it(platform, reference, archives, tmp_path):
    """`curl http://HOST:PORT/predictions/mnist -T 0.png`: the host and port are all that change."""
    digit = tmp_path / "0.png"
    digit.write_bytes(archives["mnist"].inputs["digit_0"])
    answers = [subprocess.run(["curl", "-s", f"{base}/predictions/mnist", "-T", str(digit)], capture_output=True,
                              text=True, timeout=60, check=True).stdout
               for base in (reference.inference_url, platform.worker_url())]
    assert answers[0] == answers[1] and answers[0].strip().isdigit(), answers


def test_versions_by_archive_version_and_number(platform, reference, archives):
    version = reference.describe("mnist")[0]["modelVersion"]
    digit = archives["mnist"].inputs["digit_3"]
    theirs = send(reference.predictions_url("mnist", version), digit)
    for suffix in (f"/{version}", "/1"):
        mine = send(ours(platform, "mnist", suffix), digit)
        assert mine.status_code == theirs.status_code == 200 and mine.text == theirs.text
        assert mine.headers["x-model-version"] == "1"


def test_the_serve_route_takes_json_on_the_same_endpoint(platform, reference, archives):
    """ClearML's `/serve/{endpoint}` on an archive's endpoint: the JSON body is TorchServe's `body`."""
    value = archives["subclass"].inputs["values"]
    theirs = send(reference.predictions_url("subclass"), value)
    mine = httpx.post(f"{platform.worker_url()}/serve/subclass", json=value, timeout=60)
    assert mine.status_code == 200 and theirs.status_code == 200
    same(theirs.json(), mine.json(), "subclass")


def _error(answer: httpx.Response) -> tuple[int, str, str]:
    body = without_ids(answer, ours=False)  # real TorchServe's answers too
    assert set(body) == {"code", "type", "message"} and body["code"] == answer.status_code, body
    return answer.status_code, body["type"], body["message"]


def test_unknown_model_and_version_in_torchserves_shape(platform, reference):
    for suffix, kind in (("nothing", "ModelNotFoundException"), ("mnist/9.9", "ModelVersionNotFoundException")):
        theirs = _error(httpx.post(f"{reference.inference_url}/predictions/{suffix}", content=b"x", timeout=30))
        mine = _error(httpx.post(f"{platform.worker_url()}/predictions/{suffix}", content=b"x", timeout=30))
        assert theirs[:2] == mine[:2] == (404, kind)
        assert mine[2].startswith(theirs[2]), (mine, theirs)  # ours goes on to name the endpoints there are


def test_a_body_the_handler_cannot_read_is_a_4xx_naming_why(platform, reference):
    """TorchServe answers 503 "Prediction failed" for a body an image handler cannot open; the platform
    answers 400 in the same shape, naming the handler's exception."""
    theirs = _error(httpx.put(reference.predictions_url("image_classifier"), content=b"not an image", timeout=60))
    assert theirs == (503, "InternalServerException", "Prediction failed")
    status, kind, message = _error(httpx.put(ours(platform, "image_classifier"), content=b"not an image", timeout=60))
    assert (status, kind) == (400, "BadRequestException") and "UnidentifiedImageError" in message, message


def test_batching_follows_model_config_and_only_the_failing_request_fails(platform, reference, archives):
    together = concurrently([{"value": i} for i in range(4)], ours(platform, "batched"))
    got = [a.json() for a in together]
    assert [g["scaled"] for g in got] == [0, 3, 6, 9], got  # handler.scale: 3 from model-config.yaml
    assert max(g["batch_size"] for g in got) > 1, got  # batchSize 4, maxBatchDelay 200 ms
    poison = archives["batched"].inputs["poison"]
    theirs = concurrently([{"value": 1}, poison, {"value": 3}, {"value": 4}], reference.predictions_url("batched"))
    assert sum(a.status_code == 503 for a in theirs) > 1  # TorchServe: the whole batch fails
    mine = concurrently([{"value": 1}, poison, {"value": 3}, {"value": 4}], ours(platform, "batched"))
    assert [a.status_code for a in mine] == [200, 400, 200, 200], [a.text for a in mine]
    assert [a.json()["scaled"] for a in mine if a.status_code == 200] == [3, 9, 12]


def test_a_handler_past_its_response_timeout(platform, reference, archives):
    """TorchServe answers 500 "Worker died." and restarts its worker; the platform answers 504 in TorchServe's
    shape naming the timeout, restarts the handler process, and the next request is answered."""
    slow = archives["slow"]
    theirs = _error(send(reference.predictions_url("slow"), slow.inputs["too_slow"]))
    assert theirs == (500, "InternalServerException", "Worker died.")
    started = time.monotonic()
    mine = _error(send(ours(platform, "slow"), slow.inputs["too_slow"]))
    assert mine[:2] == (504, "RequestTimeoutException") and "responseTimeout" in mine[2], mine
    assert time.monotonic() - started < 10
    fast = send(ours(platform, "slow"), slow.inputs["fast"])
    assert fast.status_code == 200 and fast.json() == send(reference.predictions_url("slow"), slow.inputs["fast"]).json()


def test_explanations_as_torchserve(platform, reference, archives):
    digit = archives["mnist"].inputs["digit_7"]
    theirs = httpx.post(f"{reference.inference_url}/explanations/mnist", content=digit, timeout=120)
    mine = httpx.post(f"{platform.worker_url()}/explanations/mnist", content=digit, timeout=120)
    assert theirs.status_code == mine.status_code == 200, mine.text
    same(theirs.json(), mine.json(), "explanations")


def test_ping(platform, reference):
    assert httpx.get(f"{platform.worker_url()}/ping").json() == httpx.get(f"{reference.inference_url}/ping").json() \
        == {"status": "Healthy"}


def test_requirements_install_per_model_where_allowed(platform, archives):
    answer = send(ours(platform, archives["requirements"].name), next(iter(archives["requirements"].inputs.values())))
    assert answer.status_code == 200, answer.text
    assert list((platform.home / "torchserve" / "packages").glob("*/.complete")), "installed into a folder of its own"


def _scrape(url: str) -> str:
    return httpx.get(url, timeout=30).text


def test_ts_metric_names_and_handler_metrics_reach_prometheus(platform, reference, archives):
    for _ in range(3):
        assert send(ours(platform, "metrics"), archives["metrics"].inputs["any"]).status_code == 200
        send(reference.predictions_url("metrics"), archives["metrics"].inputs["any"])
    theirs = _scrape(reference.metrics_url + "/metrics")
    handler_names = {line.split("{")[0] for line in theirs.splitlines()
                     if line and not line.startswith("#") and "ModelName=\"metrics\"" in line}
    assert handler_names, theirs[-2000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mine = _scrape(platform.statistics_url() + "/metrics")
        names = {line.split("{")[0] for line in mine.splitlines() if line and not line.startswith("#")}
        if handler_names <= names and 'ts_inference_requests_total{hostname=' in mine:
            break
        time.sleep(1)
    assert handler_names <= names, (handler_names, sorted(n for n in names if not n.startswith("serving_")))
    requests = [line for line in mine.splitlines() if line.startswith("ts_inference_requests_total")
                and 'model_name="metrics"' in line]
    assert requests and float(requests[0].rsplit(" ", 1)[1]) >= 3, requests


def test_a_deploy_jobs_management_calls_work_with_host_port_and_token_changed(platform, reference, archives):
    """The same TorchServe management calls against both: register from the model store (synchronous),
    list, describe, predict, unregister; the answers have TorchServe's shapes."""
    ours_url = f"http://127.0.0.1:{platform.env['SERVING_TORCHSERVE_MANAGEMENT_PORT']}"
    token = platform.headers()
    copy_into(archives["function"].mar, reference.model_store)
    calls = {}
    for side, base, headers in (("theirs", reference.management_url, {}), ("ours", ours_url, token)):
        with httpx.Client(base_url=base, headers=headers, timeout=180) as api:
            registered = api.post("/models", params={"url": "function.mar", "model_name": "echo",
                                                     "initial_workers": 1, "synchronous": "true"})
            listed, described = api.get("/models"), api.get("/models/echo")
            predicted = send(f"{reference.inference_url if side == 'theirs' else platform.worker_url()}"
                             "/predictions/echo", b"over the management api")
            gone = api.delete("/models/echo")
            missing = api.get("/models/echo")
            calls[side] = (registered, listed, described, predicted, gone, missing)
    theirs, mine = calls["theirs"], calls["ours"]
    assert [a.status_code for a in mine] == [a.status_code for a in theirs] == [200, 200, 200, 200, 200, 404], \
        [a.text for a in mine]
    assert "registered" in mine[0].json()["status"] and "registered" in theirs[0].json()["status"]
    assert set(mine[1].json()) >= {"models"} and {"modelName", "modelUrl"} <= set(mine[1].json()["models"][0])
    mine_desc, theirs_desc = mine[2].json()[0], theirs[2].json()[0]
    assert {"modelName", "modelVersion", "batchSize", "maxBatchDelay", "workers"} <= set(mine_desc), mine_desc
    assert (mine_desc["modelName"], mine_desc["modelVersion"]) == (theirs_desc["modelName"], theirs_desc["modelVersion"])
    same(_comparable("function", theirs[3].json()), _comparable("function", mine[3].json()), "echo")
    assert mine[5].json()["type"] == theirs[5].json()["type"] == "ModelNotFoundException"
