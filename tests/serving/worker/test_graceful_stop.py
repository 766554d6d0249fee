"""A worker told to stop (SIGTERM: a rolling upgrade, `serving up` stopping) finishes the requests under way
within SERVING_WORKER_GRACEFUL_STOP_S, and cancels, with a 500, only one still running past it. A real
`serving worker` process; the request is a custom engine's that sleeps as long as the body asks."""
from __future__ import annotations

import signal
import threading
import time

import httpx
from registry.artifacts import ArtifactStore

from tests.serving.worker.grpc_worker import run_worker
from tests.serving.worker.support import endpoint_spec, snapshot

SLEEPER = '''
import asyncio


class Preprocess:
    def load(self, local_file_name):
        pass

    async def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return float(body["sleep_s"])

    async def process(self, data, state, collect_custom_statistics_fn=None):
        await asyncio.sleep(data)
        return data

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"slept_s": data}
'''


def stop_during(worker, sleep_s: float) -> httpx.Response:
    """One request that takes ``sleep_s``, and SIGTERM to the worker 0.5 s into it."""
    answer: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: answer.setdefault("r", httpx.post(
        f"{worker.url}/serve/sleeper", json={"sleep_s": sleep_s}, timeout=60)))
    thread.start()
    time.sleep(0.5)
    worker.proc.send_signal(signal.SIGTERM)
    thread.join(60)
    return answer["r"]


def sleeper(tmp_path, tiny_model) -> dict:
    store = ArtifactStore(tmp_path / "home" / "artifacts")
    code = tmp_path / "sleeper.py"
    code.write_text(SLEEPER)
    return endpoint_spec("sleeper", tiny_model, store, tmp_path, engine="custom",
                         preprocess={"kind": "user", "artifact": store.put_file(code)[0], "options": {}})


def test_a_request_under_way_at_sigterm_is_answered(tmp_path, tiny_model):
    spec = sleeper(tmp_path, tiny_model)
    with run_worker(tmp_path / "home", snapshot(spec), SERVING_WORKER_GRACEFUL_STOP_S="10") as worker:
        r = stop_during(worker, 3.0)  # past uvicorn's 2 s the worker had before
        assert r.status_code == 200 and r.json() == {"slept_s": 3.0}, r.text
        worker.proc.wait(30)


def test_one_still_running_past_the_graceful_stop_is_cut(tmp_path, tiny_model):
    spec = sleeper(tmp_path, tiny_model)
    with run_worker(tmp_path / "home", snapshot(spec), SERVING_WORKER_GRACEFUL_STOP_S="1") as worker:
        started = time.monotonic()
        r = stop_during(worker, 20.0)
        assert r.status_code == 500 and time.monotonic() - started < 15
        assert r.text == "Internal Server Error"  # uvicorn's own answer to a cancelled request: what CI saw once
