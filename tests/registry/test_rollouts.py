"""Progressive rollouts end to end, real processes on real sockets: control plane (the rollout
controller), statistics service, one worker under steady load; the CLI starts and reads rollouts.

One preprocess.py serves three endpoints; what the candidate (version 2) does depends on the
endpoint: on `healthy` nothing, on `flaky` (and `flaky-paused`) it fails on half the texts, on `slow`
it takes 1.2 s (the gate: 1 s at p99, far above what the healthy versions need even on a 2-core machine
at a load average of 40, where a 400 ms gate was once failed by a healthy candidate).
"""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import httpx
import pytest

from serving.testmodels import build_bert_classifier
from tests.serving.stack import Stack, make_stack

INTERVAL_S = 3.0

PREPROCESS = '''
import time

import numpy as np
from transformers import AutoTokenizer


class Preprocess:
    def load(self, local_file_name):
        self.candidate = self.model_endpoint.version != "1"
        self.mode = self.model_endpoint.serving_url
        self.tok = AutoTokenizer.from_pretrained({tokenizer!r})

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        text = body["text"]
        if self.candidate and self.mode.startswith("flaky") and len(text) % 2:
            raise ValueError("the candidate rejects texts of odd length")
        if self.candidate and self.mode == "slow":
            time.sleep(1.2)
        enc = self.tok(text, return_tensors="np")
        return {{k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}}

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {{"logits": np.asarray(data).tolist()}}
'''

ENDPOINTS = ("healthy", "flaky", "slow", "restart", "flaky-paused")
TEXTS = ["good", "bad one", "the weather is fine", "it was a long and tiring trip"]


class Load:
    """Steady traffic to the endpoints from a few threads, about 10 requests a second each."""

    def __init__(self, stack: Stack, endpoints: list[str], threads: int = 3) -> None:
        self.url, self.endpoints = stack.worker_url(), endpoints
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        self.codes: dict[str, list[int]] = {e: [] for e in endpoints}

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not self.stop.is_set():
                for ep in self.endpoints:
                    try:
                        code = client.post(f"{self.url}/serve/{ep}", json={"text": TEXTS[i % len(TEXTS)]}).status_code
                    except httpx.HTTPError:
                        code = 0
                    self.codes[ep].append(code)
                i += 1
                time.sleep(0.1)

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model):
    home = tmp_path_factory.mktemp("rollout-stack")
    s = make_stack(home, workers=1)
    s.env["SERVING_ROLLOUT_TICK_S"] = "0.2"
    candidate = build_bert_classifier(tmp_path_factory.mktemp("candidate"), seed=3)
    code = home / "preprocess.py"
    code.write_text(PREPROCESS.format(tokenizer=str(tiny_model.tokenizer_dir)))
    try:
        s.start_components()
        s.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        s.cli("model", "upload", "--name", "clf", "--path", str(candidate.onnx_path))
        for ep in ENDPOINTS:
            s.cli("model", "add", "--endpoint", ep, "--model", "clf:1", "--engine", "onnxruntime",
                  "--preprocess", str(code))
        for ep in ENDPOINTS:
            deadline = time.monotonic() + 60
            while httpx.get(f"{s.worker_url()}/v2/models/{ep}/ready", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, f"{ep} not ready"
                time.sleep(0.2)
        yield s
    finally:
        s.stop_all()


def rollout(stack: Stack, endpoint: str) -> dict:
    return json.loads(stack.cli("rollout", "status", "--endpoint", endpoint, "--json").stdout)[0]


def wait_state(stack: Stack, endpoint: str, states: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = rollout(stack, endpoint)
        if r["state"] in states:
            return r
        time.sleep(0.5)
    raise AssertionError(f"rollout on {endpoint} still {r['state']} after {timeout}s: {r}")


def routes(stack: Stack, endpoint: str) -> dict[int, float]:
    eps = json.loads(stack.cli("endpoint", "list", "--json").stdout)
    return {t["version"]: t["weight"] for ep in eps if ep["name"] == endpoint for t in ep["targets"]}


def start(stack: Stack, endpoint: str, steps: str = "25,50,100") -> None:
    stack.cli("rollout", "start", "--endpoint", endpoint, "--model", "clf:2", "--steps", steps,
              "--interval", f"{INTERVAL_S}s", "--max-error-rate", "5%", "--max-p99-ms", "1000", "--min-requests", "3")


def test_a_healthy_candidate_reaches_100_percent_by_itself(stack):
    with Load(stack, ["healthy"]) as load:
        start(stack, "healthy")
        r = wait_state(stack, "healthy", {"succeeded", "rolled_back"}, timeout=10 * INTERVAL_S + 30)
    assert r["state"] == "succeeded", r
    assert routes(stack, "healthy") == {2: 100.0}
    # the first step's share, as started (asking for the split after `start` raced the first step on a
    # busy machine, where the CLI alone can take an interval to start)
    assert [e["weight"] for e in r["history"] if e["event"].startswith("started by")] == [25.0]
    assert [e["weight"] for e in r["history"] if e["event"] == "gates passed"] == [50.0, 100.0]
    assert set(load.codes["healthy"]) == {200}
    status = stack.cli("rollout", "status", "--endpoint", "healthy").stdout
    assert "succeeded" in status and "promoted" in status


@pytest.mark.parametrize("endpoint,why", [("flaky", "error rate"), ("slow", "p99 latency")])
def test_a_failing_candidate_is_rolled_back_within_one_interval(stack, endpoint, why):
    with Load(stack, [endpoint], threads=6):  # the slow candidate's 3 requests well within one interval
        start(stack, endpoint)
        r = wait_state(stack, endpoint, {"succeeded", "rolled_back"}, timeout=6 * INTERVAL_S + 30)
    assert r["state"] == "rolled_back" and why in r["reason"], r
    assert r["reason"].startswith("rolled back at step 1 (25%)"), r["reason"]
    # judged at the end of its first step (one interval), by the control plane's own clock (the CLI's
    # time on a busy machine is not the controller's)
    at = [datetime.fromisoformat(e["at"]) for e in (r["history"][0], r["history"][-1])]
    assert (at[1] - at[0]).total_seconds() < INTERVAL_S + 3, r["history"]
    assert routes(stack, endpoint) == {1: 100.0}
    assert "rolled_back" in stack.cli("rollout", "status", "--endpoint", endpoint).stdout


def test_a_control_plane_restart_resumes_the_rollout(stack):
    with Load(stack, ["restart"]):
        start(stack, "restart", steps="20,40,60,80,100")
        deadline = time.monotonic() + 4 * INTERVAL_S
        while rollout(stack, "restart")["step"] < 1 and time.monotonic() < deadline:
            time.sleep(1.2)
        assert rollout(stack, "restart")["step"] >= 1
        stack.stop("control-plane")
        time.sleep(1.0)
        stack.start_control_plane()
        r = wait_state(stack, "restart", {"succeeded", "rolled_back"}, timeout=8 * INTERVAL_S + 20)
    assert r["state"] == "succeeded", r
    assert any("resumed after a control-plane restart" in e["event"] for e in r["history"])
    assert routes(stack, "restart") == {2: 100.0}


def test_a_paused_rollout_takes_no_step_and_makes_no_decision_until_resumed(stack):
    """Paused before its first judgement, a failing candidate keeps its 25% under failing traffic for
    two intervals, neither stepped nor rolled back; resumed, it is judged and rolled back."""
    ep = "flaky-paused"
    start(stack, ep)  # no traffic yet: the step is held (3 requests are needed to judge)
    assert "paused at step 1 of 3 (25%)" in stack.cli("rollout", "pause", "--endpoint", ep).stdout
    again = stack.cli("rollout", "pause", "--endpoint", ep, check=False)
    assert again.returncode != 0 and "already paused" in again.stdout + again.stderr
    with Load(stack, [ep]) as load:
        deadline = time.monotonic() + 2 * INTERVAL_S
        while time.monotonic() < deadline:
            r = rollout(stack, ep)
            assert (r["state"], r["step"], r["weight"]) == ("paused", 0, 25.0), r
            assert routes(stack, ep) == {1: 75.0, 2: 25.0}
            time.sleep(0.5)
        failed = [c for c in load.codes[ep] if c != 200]
        assert failed, "the candidate failed no request while paused: the pause proved nothing"
        assert r["reason"].startswith("paused by bootstrap-admin at step 1 (25%)")
        assert r["history"][-1]["event"] == r["reason"]  # nothing happened after the pause
        assert "paused" in stack.cli("rollout", "status", "--endpoint", ep).stdout
        assert "next check in 3 s" in stack.cli("rollout", "resume", "--endpoint", ep).stdout
        r = wait_state(stack, ep, {"succeeded", "rolled_back"}, timeout=4 * INTERVAL_S + 15)
    assert r["state"] == "rolled_back" and r["reason"].startswith("rolled back at step 1 (25%): error rate"), r
    events = [e["event"] for e in r["history"]]
    resumed = events.index("resumed by bootstrap-admin")
    assert events[resumed - 1].startswith("paused by bootstrap-admin") and resumed == len(events) - 2
    with stack.api() as api:
        audit = {e["action"]: e for e in api.get("/audit", params={"limit": 50}).json() if e["target"] == ep}
    for verb in ("pause", "resume"):
        entry = audit[f"POST /rollouts/{{endpoint}}/{verb}"]
        assert (entry["actor"], entry["detail"]["status"]) == ("bootstrap-admin", 200)


def test_rollout_requests_are_checked(stack):
    bad = stack.cli("rollout", "start", "--endpoint", "healthy", "--model", "clf:1", "--steps", "50,20",
                    check=False)
    assert bad.returncode != 0 and "steps must increase" in bad.stdout + bad.stderr
    bad = stack.cli("rollout", "start", "--endpoint", "nope", "--model", "clf:2", check=False)
    assert bad.returncode != 0 and "endpoint nope not found" in bad.stdout + bad.stderr
    for verb in ("abort", "pause", "resume"):
        bad = stack.cli("rollout", verb, "--endpoint", "healthy", check=False)
        assert bad.returncode != 0 and "no rollout running or paused" in bad.stdout + bad.stderr, verb
