"""Old keep-alive connections are closed after an answer (serving/worker/connection_age.py), so a Service can
send the client's next requests to workers added since; real sockets, a real uvicorn, httpx's pool."""
from __future__ import annotations

import time

import httpx
from fastapi import FastAPI, Request

from serving.worker.connection_age import ConnectionAge
from tests.support.servers import serve_in_thread


def peer_port_app(max_age_s: float) -> ConnectionAge:
    app = FastAPI()

    @app.get("/port")
    def port(request: Request) -> dict:
        return {"port": request.client.port}

    return ConnectionAge(app, max_age_s)


def ports_over(url: str, seconds: float) -> tuple[list[int], list[str]]:
    ports, closes = [], []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=10) as client:  # one keep-alive connection while the server allows
        while time.monotonic() < deadline:
            r = client.get("/port")
            assert r.status_code == 200
            ports.append(r.json()["port"])
            closes.append(r.headers.get("connection", ""))
            time.sleep(0.05)
    return ports, closes


def test_a_connection_past_its_age_is_closed_after_an_answer_and_the_client_reconnects():
    with serve_in_thread(peer_port_app(0.3)) as url:
        ports, closes = ports_over(url, 1.6)
    distinct = list(dict.fromkeys(ports))
    assert len(distinct) >= 4, distinct  # a new connection about every 0.3 s
    assert closes.count("close") == len(distinct) - 1 or closes.count("close") == len(distinct)
    # each connection's last answer said close; the others did not
    for i, port in enumerate(ports[:-1]):
        assert (closes[i] == "close") == (ports[i + 1] != port)


def test_off_keeps_one_connection():
    with serve_in_thread(peer_port_app(0.0)) as url:
        ports, closes = ports_over(url, 0.8)
    assert len(set(ports)) == 1 and "close" not in closes


def test_a_connection_used_again_after_a_long_pause_is_closed_after_that_answer():
    """The last CI's 500 (a KeyError): a request came on an address and port first seen more than 4 ages before
    (a connection used again after a pause, or a new one on a reused port: the health checks' closed
    connections stay known until pruned), and the prune between looking it up and forgetting it had removed it. Now it is known by its last request and
    closed after the answer; a connection silent past the horizon is forgotten."""
    import asyncio

    clock = [0.0]

    async def answer(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = ConnectionAge(answer, 0.5, clock=lambda: clock[0])

    def request(port: int) -> list[tuple]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        asyncio.run(app({"type": "http", "client": ("127.0.0.1", port)}, None, send))
        return sent[0]["headers"]

    assert request(1) == [] and request(2) == []  # both open at 0
    clock[0] = 2.1  # past 4 ages since both opened
    assert request(1) == [(b"connection", b"close")]  # old: closed after this answer, not a 500
    assert set(app._known) == set()  # 1 forgotten as closed, 2 pruned (silent past the horizon)
    assert request(1) == []  # the client's new connection


def test_the_worker_applies_the_setting(make_client, clf_spec):
    client, _ = make_client(clf_spec, worker_max_connection_age_s=0.2)
    assert "connection" not in client.get("/v2/health/live").headers
    time.sleep(0.3)
    assert client.get("/v2/health/live").headers["connection"] == "close"
    assert "connection" not in client.get("/v2/health/live").headers  # a new connection, as the server sees it


def test_a_real_worker_recycles_http_and_grpc_connections_and_every_call_is_answered(tmp_path, tiny_model):
    """``serving worker --workers 2`` with a 0.5 s age: over 2.5 s of calls on one keep-alive HTTP client and
    one gRPC channel, HTTP connections are closed after answers and gRPC's are told to go (GOAWAY), and
    every call is answered (gRPC's equal to onnxruntime's logits)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from registry.artifacts import ArtifactStore
    from tests.serving.worker.grpc_worker import run_worker, tensor_inputs
    from tests.serving.worker.support import endpoint_spec, snapshot
    from tests.serving.worker.test_serve_rest import direct
    from tests.serving.worker.test_v2 import TEXT, tokens

    home = tmp_path / "home"
    clf = endpoint_spec("clf", tiny_model, ArtifactStore(home / "artifacts"), tmp_path)
    expected = direct(tiny_model, [TEXT])
    with run_worker(home, snapshot(clf), processes=2, SERVING_WORKER_MAX_CONNECTION_AGE_S="0.5") as worker:
        grpc_client = grpcclient.InferenceServerClient(worker.grpc)
        closes, calls = 0, 0
        with httpx.Client(base_url=f"http://127.0.0.1:{worker.http_port}", timeout=10) as http:
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                r = http.post("/serve/clf", json={"text": TEXT})
                assert r.status_code == 200, r.text
                closes += r.headers.get("connection") == "close"
                result = grpc_client.infer("clf", tensor_inputs(grpcclient, tokens(tiny_model)),
                                           outputs=[grpcclient.InferRequestedOutput("logits")])
                np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-4)
                calls += 1
                time.sleep(0.02)
        grpc_client.close()
    assert closes >= 3 and calls >= 20, (closes, calls)
