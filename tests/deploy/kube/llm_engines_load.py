"""LLM engines the control plane runs on the test cluster, and chat load on them: shared by the engines' test
(test_llm_engines.py) and benchmark (benchmarks/autoscaling.py --target engines).

- ``build_vllm_image``: vLLM's CPU build (deploy/vllm-cpu) as the engine image, into the node;
- ``engine_values``: the chart's llmEngines with that image, sized for a 2-core node, autoscaled by each
  engine's HPA or not;
- ``deploy_chat``: a tiny Llama uploaded and deployed as endpoint ``chat`` with the CLI, a client key for it,
  and the engine answering through the workers' Service;
- ``chat_request``: a ``Clients`` request (autoscaling_load.py) whose answer must be greedy generate's.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.testmodels_llm import chat_prompt_ids, greedy_reference, same_text
from tests.deploy.artifacts import REPO
from tests.deploy.engine import engine_env, why_not
from tests.deploy.kube.autoscaling_load import Request, external_metric, ready_pods
from tests.deploy.kube.helm_release import NS, Release, repo_tag
from tests.support.ci import cannot_run
from tests.support.kube import images
from tests.support.procs import wait_until

VLLM_IMAGE = "localhost/serving-vllm-cpu:latest"  # pinned content (deploy/vllm-cpu): one tag per machine
ENGINE_LABEL = "app.kubernetes.io/component=llm-engine"
MAX_TOKENS = 8  # answers compared with greedy generate as decoded (longer random-weight answers hold byte tokens)
PROMPT = "tell me about canary releases"


def build_vllm_image(cluster) -> str:
    why = why_not()
    if why:
        cannot_run(f"the engine image cannot be built here: {why}")
    env = engine_env()
    start = time.monotonic()
    out = subprocess.run(["bash", str(REPO / "scripts" / "images.sh"), "--vllm"], cwd=REPO, capture_output=True,
                         text=True, timeout=1800, env={**env, "SERVING_VLLM_IMAGE": VLLM_IMAGE})
    assert out.returncode == 0, f"scripts/images.sh --vllm failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    cluster.timings["vLLM image build"] = time.monotonic() - start
    start = time.monotonic()
    images.import_podman_image(cluster, VLLM_IMAGE, env)
    cluster.timings["vLLM image into the node"] = time.monotonic() - start
    return VLLM_IMAGE


def engine_values(image: str, most: int | None = None, per_replica: int = 2, down_window_s: int = 20) -> dict:
    """llmEngines on vLLM's CPU build; ``most``: each engine's HPA on its waiting requests, 1 to ``most`` pods,
    quick both ways (a test's pace); None: no HPA (a version's replicas= is the count)."""
    engines = {
        "enabled": True, "image": repo_tag(image), "python": "/opt/vllm/bin/python", "gpus": 0,
        "kvCacheGb": 0.25, "shmSize": "512Mi", "startupSeconds": 600,
        # what the suite's engines skip on a 2-core machine (tests/conftest.py): torch.compile, a third process;
        # one sequence at a time, so that concurrent requests wait in the engine's queue (the HPA's signal)
        "extraArgs": ["-O0", "--max-num-seqs", "1"], "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}}}
    if most is None:
        return {"llmEngines": engines}
    engines["autoscaling"] = {
        "enabled": True, "minReplicas": 1, "maxReplicas": most, "waitingRequestsPerReplica": per_replica,
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0},
                     "scaleDown": {"stabilizationWindowSeconds": down_window_s,
                                   "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]}}}
    return {"llmEngines": engines, "metricsApi": {"enabled": True}}


def engines(release: Release) -> list[dict]:
    return release.cluster.get("deployments", "-n", NS, "-l", ENGINE_LABEL)["items"]


def engine_pods(release: Release) -> list[dict]:
    return release.cluster.get("pods", "-n", NS, "-l", ENGINE_LABEL)["items"]


def ready_engine_pods(release: Release) -> int:
    return ready_pods(engine_pods(release))


def waiting(release: Release, engine: str) -> float | None:
    """The engine's waiting requests as its HPA reads them (the metrics API, selected by the engine)."""
    return external_metric(release, "serving_llm_waiting_requests", f"serving.io/engine={engine}")


@dataclass
class Chat:
    key: str              # a client key for endpoint ``chat``
    messages: list[dict]
    want: str             # greedy generate's answer to ``messages``, decoded
    created_s: float      # `model add` to the engine's Deployment
    ready_s: float        # `model add` to the first answer through the workers' Service

    def request(self, max_tokens: int = MAX_TOKENS) -> Request:
        body = {"model": "chat", "messages": self.messages, "max_tokens": max_tokens, "temperature": 0}

        def send(client: httpx.Client, number: int) -> tuple[str, None]:
            r = client.post("/serve/openai/v1/chat/completions", json=body)
            text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None
            ok = text is not None and same_text(text, self.want)
            return ("ok" if ok else f"wrong: {r.status_code} {r.text[:200]}"), None
        return send


def chat(release: Release, key: str, messages: list[dict], max_tokens: int = MAX_TOKENS) -> httpx.Response:
    with httpx.Client(base_url=release.service_url("worker", 9090), timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        return client.post("/serve/openai/v1/chat/completions",
                           json={"model": "chat", "messages": messages, "max_tokens": max_tokens, "temperature": 0})


def deploy_chat(release: Release, folder: Path, *aux: str) -> Chat:
    """``serving model upload`` of ``folder`` and ``model add --engine vllm`` (``aux``: --aux-config pairs) as
    endpoint ``chat``, a key for it, and the first answer through the workers' Service."""
    from transformers import AutoTokenizer

    release.cli("model", "upload", "--name", "tiny-llm", "--path", str(folder))
    start = time.monotonic()
    release.cli("model", "add", "--endpoint", "chat", "--engine", "vllm", "--model", "tiny-llm:1",
                *(("--aux-config", *aux) if aux else ()))
    wait_until(lambda: engines(release), 60, "the engine's Deployment", interval=0.5, on_timeout=release.describe)
    created_s = time.monotonic() - start
    (key,) = re.findall(r"\bsk_[0-9a-f]{64}\b", release.cli("key", "create", "--name", "chat", "--endpoints",
                                                             "chat").stdout)
    release.client_key = key
    messages = [{"role": "user", "content": PROMPT}]
    wait_until(lambda: chat(release, key, messages).status_code == 200, 900,
               "the engine's first answer through the workers' Service", interval=3, on_timeout=release.describe)
    ready_s = time.monotonic() - start
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    want = tokenizer.decode(greedy_reference(folder, chat_prompt_ids(tokenizer, messages), MAX_TOKENS))
    return Chat(key, messages, want, created_s, ready_s)
