"""The OpenAI API over the embedded engine: the launcher (`serving llm`) runs vLLM for the deployed version
and the worker finds it through the launcher's /engines map. One engine start for the module.

Checked: `model add --engine vllm --wait` returns once the worker answers; greedy answers equal
transformers; the engine killed (SIGKILL) mid-traffic answers 503 in OpenAI's shape with Retry-After,
never another error, and the endpoint comes back by itself (the launcher restarts the engine on
another port, the worker asks the map again).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import psutil
import pytest

from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama, greedy_reference
from tests.serving.stack import make_stack
from tests.support.ci import cannot_run
from tests.support.procs import REPO, wait_until

openai = pytest.importorskip("openai")
START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("openai-launcher")
    bundle = build_tiny_llama(root / "tiny-llama")
    stack = make_stack(root / "home", workers=1)
    try:
        stack.start_control_plane()
        stack.start_llm()
        stack.start_worker(0)
        stack.cli("model", "upload", "--name", "tiny", "--path", str(bundle.path))
        res = subprocess_cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "chat", "--name", "tiny",
                             "--aux-config", "max_model_len=512", "--wait", "--wait-timeout", str(START_S))
        assert res.returncode == 0, res.stdout + res.stderr
        stack.bundle = bundle
        stack.base = f"{stack.worker_url()}/serve/openai/v1"
        yield stack
    finally:
        stack.stop_all()


def subprocess_cli(stack, *args: str) -> subprocess.CompletedProcess:
    """The CLI, with room for an engine's start (Stack.cli allows 120 s)."""
    return subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=stack.env, cwd=REPO,
                          capture_output=True, text=True, timeout=START_S + 60)


def engines(stack) -> dict:
    return httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]


def test_the_wait_returns_with_the_engine_answering_as_transformers(stack):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(stack.bundle.path))("the quick brown fox")["input_ids"]
    c = openai.OpenAI(api_key="-", base_url=stack.base, max_retries=0)
    r = c.completions.create(model="chat", prompt="the quick brown fox", max_tokens=8, temperature=0,
                             extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == greedy_reference(stack.bundle.path, ids, 8)
    assert [m.id for m in c.models.list()] == ["chat"]


def test_the_engine_killed_mid_traffic_is_a_503_then_comes_back_by_itself(stack):
    entry = engines(stack)["tiny:1"]
    port = int(entry["url"].rsplit(":", 1)[1].split("/")[0])
    pid = next(p.pid for p in psutil.process_iter(["cmdline"])
               if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and str(port) in p.info["cmdline"])
    seen: list[tuple[int, dict]] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=stack.base, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/completions", json={"model": "chat", "prompt": "hello", "max_tokens": 2})
                seen.append((r.status_code, r.json() if r.status_code != 200 else {},
                             r.headers.get("Retry-After")))

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 3, 60, "traffic answered before the kill")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: any(s == 503 for s, _, _ in seen), 60, "a 503 while the engine is down")
        mark = len(seen)
        wait_until(lambda: any(s == 200 for s, _, _ in seen[mark:]), START_S, "answers again, by themselves",
                   interval=1)
    finally:
        stop.set()
        thread.join(120)
    statuses = {s for s, _, _ in seen}
    assert statuses <= {200, 503}, statuses
    for status, body, retry in seen:
        if status == 503:
            assert set(body) == {"error"} and body["error"]["code"] == "engine_unavailable", body
            assert retry is not None
