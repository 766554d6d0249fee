"""Every input checked at the worker's edge, against a real worker process on a real socket: bad numbers,
bad v2 headers and bad binary tensors are 4xx with a message, never a 500; and should a bug ever
cause a 500, the answer is one line of JSON with ``Connection: close`` and keep-alive clients go on."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import httpx
import pytest
from fastapi import FastAPI

from serving.worker.app import create_app
from tests.serving.worker.support import endpoint_spec, snapshot, worker_settings
from tests.support.procs import REPO, free_port, stop, wait_http
from tests.support.servers import serve_in_thread
from tests.support.error_bodies import without_ids

HEADER = "Inference-Header-Content-Length"


def v2(inputs: list[dict], **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def ids(data, **spec) -> dict:
    return {"name": "input_ids", "datatype": "INT64", "shape": [1, len(data)], "data": data, **spec}


# (what, path, body, headers, expected status)
BAD = [
    ("INT64 of 2**70", "/v2/models/clf/infer", v2([ids([2**70, 1])]), {}, 400),
    ("INT64 of 2**64-1", "/v2/models/clf/infer", v2([ids([2**64 - 1])]), {}, 400),
    ("INT64 of 1.5", "/v2/models/clf/infer", v2([ids([1.5])]), {}, 400),
    ("INT32 of 2**40", "/v2/models/clf/infer", v2([ids([2**40], datatype="INT32")]), {}, 400),
    ("input parameters a list", "/v2/models/clf/infer", v2([ids([1], parameters=[1])]), {}, 400),
    ("request parameters a list", "/v2/models/clf/infer", v2([ids([1])], parameters=[1]), {}, 400),
    ("outputs parameters a string", "/v2/models/clf/infer",
     v2([ids([1])], outputs=[{"name": "logits", "parameters": "x"}]), {}, 400),
    ("outputs not a list", "/v2/models/clf/infer", v2([ids([1])], outputs={"a": 1}), {}, 400),
    ("binary_data_size 'abc'", "/v2/models/clf/infer",
     v2([ids([1], parameters={"binary_data_size": "abc"})]), {}, 400),
    ("binary_data_size {}", "/v2/models/clf/infer", v2([ids([1], parameters={"binary_data_size": {}})]), {}, 400),
    ("binary_data_size -8", "/v2/models/clf/infer", v2([ids([1], parameters={"binary_data_size": -8})]), {}, 400),
    ("shape of 2**62 elements", "/v2/models/clf/infer", v2([ids([1], shape=[2**31, 2**31])]), {}, 400),
    ("header length past the body", "/v2/models/clf/infer", v2([ids([1])]), {HEADER: "99999"}, 400),
    ("header length negative", "/v2/models/clf/infer", v2([ids([1])]), {HEADER: "-3"}, 400),
    ("header length a superscript digit", "/v2/models/clf/infer", v2([ids([1])]),
     {HEADER: "\u00b9".encode("latin-1")}, 400),
    ("id not a string", "/v2/models/clf/infer", v2([ids([1])], id={"a": 2**70}), {}, 400),
    ("version a superscript one", "/serve/clf/%C2%B9", b'{"text": "x"}', {}, 404),
    ("version an Arabic-Indic three", "/serve/clf/%D9%A3", b'{"text": "x"}', {}, 404),
    ("version 2**63", "/serve/clf/9223372036854775808", b'{"text": "x"}', {}, 404),
    ("v2 version a superscript one", "/v2/models/clf/versions/%C2%B9/infer", v2([ids([1])]), {}, 404),
]


def bytes_body(declared: int, actual: bytes) -> tuple[bytes, dict]:
    """A BYTES tensor whose 4-byte length prefix says more than the data holds."""
    blob = struct.pack("<I", declared) + actual
    head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    return head + blob, {HEADER: str(len(head))}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_model):
    """`serving worker` serving a cached snapshot (its control plane is not there)."""
    from registry.artifacts import ArtifactStore

    home = tmp_path_factory.mktemp("edge-home")
    store = ArtifactStore(home / "artifacts")
    cache = home / "worker-config.json"
    cache.write_text(json.dumps(snapshot(endpoint_spec("clf", tiny_model, store, home))))
    port = free_port()
    env = {**os.environ, "SERVING_HOME": str(home), "SERVING_ARTIFACT_DIR": str(home / "artifacts"),
           "SERVING_WORKER_CACHE": str(cache), "SERVING_WORKER_PORT": str(port),
           "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{free_port()}", "SERVING_STATISTICS_ENABLED": "false"}
    log = open(home / "worker.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "worker"], env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v2/health/ready", timeout=90, proc=proc)
        yield url
    finally:
        stop(proc)
        assert "Traceback" not in (home / "worker.log").read_text(), (home / "worker.log").read_text()[-3000:]


@pytest.mark.timeout(180)
def test_bad_inputs_are_4xx_with_a_message_on_one_keep_alive_connection(worker):
    cases = BAD + [("BYTES prefix past its data", "/v2/models/clf/infer", *bytes_body(100, b"short"), 400),
                   ("BYTES prefix cut short", "/v2/models/clf/infer", *bytes_body(1, b"x\x01\x00"), 400)]
    with httpx.Client(base_url=worker, timeout=30,
                      limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)) as client:
        for what, path, body, headers, expected in cases:
            r = client.post(path, content=body, headers=headers)
            assert r.status_code == expected, (what, r.status_code, r.text)
            assert r.json()["error"], what
            assert r.headers.get("connection") != "close", what
        assert client.post("/serve/clf/1", json={"text": "still fine"}).status_code == 200
        assert client.get("/status").json()["internal_errors"] == 0


@pytest.mark.timeout(120)
def test_last_resort_500_is_one_json_line_with_connection_close(tmp_path, tiny_model):
    from registry.artifacts import ArtifactStore

    home = tmp_path / "home"
    spec = endpoint_spec("clf", tiny_model, ArtifactStore(home / "artifacts"), tmp_path)
    app: FastAPI = create_app(worker_settings(home), snapshot=snapshot(spec))

    @app.get("/boom")
    def boom():
        raise RuntimeError("a bug")

    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        r = client.get("/boom")
        assert r.status_code == 500
        assert r.headers["connection"] == "close"
        assert r.text.count("\n") == 0 and without_ids(r) == {"error": "internal error (RuntimeError); see the worker log"}
        # the next request of the same client is answered (on a new connection, as the server said)
        assert client.post("/serve/clf", json={"text": "after a bug"}).status_code == 200
        assert client.get("/status").json()["internal_errors"] == 1


@pytest.mark.timeout(120)
def test_a_killed_worker_process_costs_only_its_requests_in_flight(worker):
    """`serving worker` with one process: its manager keeps the socket and starts a new process, so
    connections made meanwhile wait instead of being refused."""
    import psutil

    def pid() -> int:
        return httpx.get(f"{worker}/status", timeout=10).json()["pid"]

    first = pid()
    os.kill(first, signal.SIGKILL)
    t0 = time.monotonic()
    with httpx.Client(base_url=worker, timeout=60) as client:  # a new connection, made at once
        r = client.post("/serve/clf", json={"text": "served by the new process"})
    assert r.status_code == 200, r.text
    assert pid() != first and not psutil.pid_exists(first)
    print(f"answered {time.monotonic() - t0:.1f} s after kill -9 of the only worker process")
