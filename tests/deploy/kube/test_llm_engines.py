"""On the real cluster, an LLM version deployed with the CLI gets its own engine: a Deployment and a Service the
control plane makes through the Kubernetes API, deleted when the version goes (serving/llm/kube/).

One install with ``llmEngines.enabled`` and vLLM's CPU build as the engine image (deploy/vllm-cpu, built here
with podman as the other images are, and copied into the node): the launcher runs in the control plane's pod
with the chart's Role. A tiny random-weight Llama is uploaded and deployed with `serving model add --engine
vllm`; the engine's pod fetches the folder from the registry's artifacts in its init container; the workers'
Service answers the OpenAI API with transformers' greedy generate's own tokens. The engine's own HPA (made by the
launcher, ``llmEngines.autoscaling``) scales it on its waiting requests, read by the control plane's external
metrics API from that engine's pods: a step load of 1, then 6, then 1 clients (the engine takes one sequence at
a time, so the others wait) takes it from 1 to 2 pods and back, every answer equal to greedy generate's, none
lost. A LoRA adapter of the version joins its engine by a rolling update, the base answering meanwhile. A version
deployed with ``scale_to_zero_after_s`` goes to zero pods once idle; the next requests are held by the workers,
which wake it, and answered as greedy generate answers; past a worker's bound they get 503 with Retry-After; the
cold start is printed. `serving endpoint remove` deletes the Deployment, its Service and its HPA. Times are printed.
"""
from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from serving.llm.kube.manifests import KEY_ANNOTATION
from serving.testmodels_llm import build_tiny_llama, chat_prompt_ids, greedy_reference, same_text
from tests.deploy.kube.autoscaling_load import Clients, Watch, percentile_ms
from tests.deploy.kube.llm_engines_load import (
    ENGINE_LABEL, MAX_TOKENS, build_vllm_image, chat, deploy_chat, engine_pods, engine_values, engines,
    ready_engine_pods, waiting,
)
from tests.deploy.kube.helm_release import NS, RELEASE, installed
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(2400)  # a first build of the vLLM image: about 10 min here

MOST, PER_REPLICA = 2, 2
UP_WITHIN_S, DOWN_WITHIN_S = 300, 150
IDLE_S, HOLD_MAX = 20, 4  # the idle engine's scale_to_zero_after_s; the requests one worker process holds


@pytest.fixture(scope="module")
def release(kube_cluster, platform_images_in_node, tmp_path_factory):
    image = build_vllm_image(kube_cluster)
    values = engine_values(image, most=MOST, per_replica=PER_REPLICA)
    values["worker"] = {"extraEnv": [{"name": "SERVING_LLM_HOLD_MAX", "value": str(HOLD_MAX)}]}
    with installed(kube_cluster, platform_images_in_node, tmp_path_factory.mktemp("llm-engines"), values) as rel:
        yield rel


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="module")
def deployed(release, llm):
    assert engines(release) == []  # the chart itself runs no engine
    return deploy_chat(release, llm.path)


def engine_services(release) -> list[dict]:
    return release.cluster.get("services", "-n", NS, "-l", ENGINE_LABEL)["items"]


def launcher_entry(release, key: str = "tiny-llm:1") -> dict:
    """The launcher's map (GET /engines on the control plane's Service): where the workers find the engine."""
    with httpx.Client(base_url=release.service_url("control-plane", 8004), timeout=10) as client:
        return client.get("/engines").json()["engines"][key]


def test_a_version_deployed_with_the_cli_gets_an_engine_of_its_own_that_answers_as_greedy_generate(
        release, llm, deployed):
    from transformers import AutoTokenizer

    (deployment,) = engines(release)
    assert deployment["metadata"]["annotations"][KEY_ANNOTATION] == "tiny-llm:1"
    (owner,) = deployment["metadata"]["ownerReferences"]  # helm uninstall's garbage collection takes it
    assert owner["kind"] == "Deployment" and owner["name"] == f"{RELEASE}-serving-control-plane"
    (service,) = engine_services(release)
    assert service["spec"]["clusterIP"] == "None"
    (pod,) = engine_pods(release)
    init = pod["status"]["initContainerStatuses"][0]
    assert init["name"] == "model" and init["state"]["terminated"]["exitCode"] == 0  # the folder came from the registry
    entry = launcher_entry(release)
    assert entry["state"] == "ready" and entry["url"] == f"http://{pod['status']['podIP']}:8000/v1", entry

    tokenizer = AutoTokenizer.from_pretrained(str(llm.path))
    conversation = list(deployed.messages)
    for follow_up in (None, "and rollbacks"):
        if follow_up:
            conversation.append({"role": "user", "content": follow_up})
        reply = chat(release, deployed.key, conversation)
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["message"]["content"]
        want = tokenizer.decode(greedy_reference(llm.path, chat_prompt_ids(tokenizer, conversation), MAX_TOKENS))
        assert same_text(text, want), (text, want)
        assert reply.headers["X-Model-Version"] == "1"
        conversation.append({"role": "assistant", "content": text})
    print(f"\nengine on the cluster: Deployment made {deployed.created_s:.1f} s after `model add`, first answer after "
          f"{deployed.ready_s:.1f} s (init container fetching the folder, vLLM's start); 2 answers equal to "
          "greedy generate")


def test_the_engines_own_hpa_scales_it_on_its_waiting_requests_and_back(release, deployed):
    (dep,) = engines(release)
    name = dep["metadata"]["name"]
    hpas = release.cluster.get("hpa", "-n", NS, "-l", ENGINE_LABEL)["items"]
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == [name]
    wait_until(lambda: waiting(release, name) is not None, 120, "the engine's waiting requests served by the metrics API",
               interval=2, on_timeout=release.describe)
    clients = Clients(release, request=deployed.request()).start(6)
    marks: dict[str, float] = {}
    try:
        with Watch(release, clients, metric=lambda r: waiting(r, name), ready=ready_engine_pods) as watch:
            clients.count = 1
            marks["1 client"] = time.monotonic()
            time.sleep(20)
            assert ready_engine_pods(release) == 1, "one client, nothing waiting: one engine pod"
            clients.count = 6
            marks["6 clients"] = time.monotonic()
            wait_until(lambda: ready_engine_pods(release) == MOST, UP_WITHIN_S, f"{MOST} ready engine pods under 6 clients",
                       interval=1, on_timeout=release.describe)
            up_s = time.monotonic() - marks["6 clients"]
            # the launcher's map follows the pods within its 2 s reconcile: the workers route over both
            wait_until(lambda: [r["state"] for r in launcher_entry(release)["replicas"]] == ["ready"] * MOST, 10,
                       f"GET /engines listing {MOST} ready replicas")
            marks["scaled"] = time.monotonic()
            time.sleep(20)
            clients.count = 1
            marks["1 client again"] = time.monotonic()
            wait_until(lambda: ready_engine_pods(release) == 1 and len(engine_pods(release)) == 1, DOWN_WITHIN_S,
                       "back to one engine pod under 1 client", interval=1, on_timeout=release.describe)
            down_s = time.monotonic() - marks["1 client again"]
            time.sleep(5)
    finally:
        clients.stop()
    bad = [o for *_, o in clients.results if o != "ok"]
    phases = list(marks.items()) + [("end", time.monotonic())]
    print(f"\nengine HPA step load (1 -> 6 -> 1 clients, one sequence at a time, {PER_REPLICA} waiting a replica): "
          f"{len(clients.results)} requests, {len(bad)} lost or wrong; {MOST} pods ready {up_s:.0f} s after the rise, "
          f"back to 1 {down_s:.0f} s after the fall")
    for (label, start), (_, end) in zip(phases, phases[1:]):
        lat = [d for t, d, o in clients.results if start <= t < end and o == "ok"]
        print(f"  {label:16s} {len(lat):4d} answers, p50 {percentile_ms(lat, 50):7.0f} ms, "
              f"p99 {percentile_ms(lat, 99):7.0f} ms")
    for s in watch.samples[::10]:
        print(f"  t={s.t - marks['1 client']:6.1f} s  clients {s.clients}  desired {s.desired}  ready {s.ready}  "
              f"waiting {s.metric}")
    assert not bad, bad[:5]


def completion(release, key: str, model: str, ids: list[int]) -> httpx.Response:
    with httpx.Client(base_url=release.service_url("worker", 9090), timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        return client.post("/serve/openai/v1/completions", json={
            "model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True})


def test_an_adapter_joins_its_bases_engine_by_a_rolling_update_and_answers_as_merged_weights(
        release, llm, deployed, tmp_path_factory):
    """A LoRA adapter deployed with the CLI runs in its base's engine: the launcher replaces the engine's pods by
    ones started with it (--lora-modules, its folder fetched by the init container). The base keeps answering
    while the new pod starts; then the adapter answers with the merged weights' greedy tokens, the base with its
    own."""
    from transformers import AutoTokenizer

    from serving.testmodels_llm import build_lora_adapter, merged_greedy_reference

    adapter = build_lora_adapter(tmp_path_factory.mktemp("adapter") / "adapter", llm.path, seed=1)
    release.cli("model", "upload", "--name", "support-bot", "--path", str(adapter), "--base", "tiny-llm:1")
    (before,) = engines(release)
    start = time.monotonic()
    release.cli("model", "add", "--engine", "vllm", "--endpoint", "support", "--model", "support-bot:1")
    (key,) = re.findall(r"\bsk_[0-9a-f]{64}\b", release.cli("key", "create", "--name", "support", "--endpoints",
                                                             "chat,support").stdout)
    ids = AutoTokenizer.from_pretrained(str(llm.path))("the quick brown fox")["input_ids"]
    base = greedy_reference(llm.path, ids, MAX_TOKENS)
    want = merged_greedy_reference(llm.path, adapter, ids, MAX_TOKENS)
    assert want != base, "the adapter changes the answer (else this test could not tell them apart)"
    outcomes: list[bool] = []
    while time.monotonic() - start < 600:
        reply = completion(release, key, "support", ids)
        if reply.status_code == 200:
            break
        r = completion(release, key, "chat", ids)  # meanwhile the base still answers, as itself
        outcomes.append(r.status_code == 200 and r.json()["choices"][0]["token_ids"] == base)
        time.sleep(1)
    ready_s = time.monotonic() - start
    assert reply.status_code == 200, release.describe()
    assert reply.json()["choices"][0]["token_ids"] == want and reply.headers["X-Model-Version"] == "1"
    assert completion(release, key, "chat", ids).json()["choices"][0]["token_ids"] == base
    assert outcomes and all(outcomes), outcomes
    (after,) = engines(release)
    assert after["metadata"]["name"] == before["metadata"]["name"]  # the same engine, its pods replaced
    command = after["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--lora-modules") + 1].startswith("support-bot:1=")
    print(f"\nadapter in its base's engine: answering {ready_s:.0f} s after `model add` (a new pod started with it); "
          f"meanwhile the base answered {len(outcomes)} of {len(outcomes)} requests as itself")


def test_an_idle_engine_goes_to_zero_and_the_requests_that_wake_it_are_held_and_answered(release, llm):
    """``--aux-config scale_to_zero_after_s=20``: the version's own engine (another model name, so another engine)
    goes to zero pods after 20 s without a request. Then 6 requests at once to one worker pod and 3 to the other:
    each worker holds up to HOLD_MAX and wakes the engine; the 2 past the bound get 503 with Retry-After at once
    (OpenAI's error shape); the 7 held are answered as greedy generate answers once the engine is back."""
    from transformers import AutoTokenizer

    release.cli("model", "upload", "--name", "tiny-idle", "--path", str(llm.path))
    release.cli("model", "add", "--engine", "vllm", "--endpoint", "idle", "--model", "tiny-idle:1",
                "--aux-config", f"scale_to_zero_after_s={IDLE_S}")
    (key,) = re.findall(r"\bsk_[0-9a-f]{64}\b", release.cli("key", "create", "--name", "idle", "--endpoints",
                                                             "idle").stdout)
    messages = [{"role": "user", "content": "when does an idle engine sleep"}]
    tokenizer = AutoTokenizer.from_pretrained(str(llm.path))
    want = tokenizer.decode(greedy_reference(llm.path, chat_prompt_ids(tokenizer, messages), MAX_TOKENS))
    body = {"model": "idle", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"}

    def ask(base: str) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=400, headers=headers) as client:
            return client.post("/serve/openai/v1/chat/completions", json=body)

    service = release.service_url("worker", 9090)
    wait_until(lambda: ask(service).status_code == 200, 900, "the idle endpoint's first answer", interval=3,
               on_timeout=release.describe)
    engine = lambda: launcher_entry(release, "tiny-idle:1")  # noqa: E731
    start = time.monotonic()
    wait_until(lambda: engine()["state"] == "scaled_to_zero", 180, "the idle engine scaled to zero", interval=1,
               on_timeout=release.describe)
    asleep_s = time.monotonic() - start
    assert asleep_s >= IDLE_S - 3, f"asleep {asleep_s:.0f} s after its last answer: idle time is counted wrong"
    (dep,) = [d for d in engines(release) if d["metadata"]["annotations"][KEY_ANNOTATION] == "tiny-idle:1"]
    assert dep["spec"]["replicas"] == 0
    wait_until(lambda: not [p for p in engine_pods(release) if p["metadata"]["labels"]["serving.io/engine"]
                            == dep["metadata"]["name"]], 120, "the idle engine's pod gone", interval=1)

    workers = [f"http://{p['status']['podIP']}:9090" for p in release.pods("worker")]
    replies: list[tuple[float, httpx.Response]] = []
    woken = time.monotonic()

    def one(base: str) -> None:
        reply = ask(base)
        replies.append((time.monotonic() - woken, reply))

    threads = [threading.Thread(target=one, args=(workers[0],)) for _ in range(HOLD_MAX + 2)]
    threads += [threading.Thread(target=one, args=(workers[1],)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    refused = [(s, r) for s, r in replies if r.status_code == 503]
    answered = [(s, r) for s, r in replies if r.status_code == 200]
    assert len(replies) == len(threads) and len(refused) == 2 and len(answered) == len(threads) - 2, \
        [(s, r.status_code, r.text[:200]) for s, r in replies]
    for s, r in refused:  # at once, in OpenAI's shape, saying why and when to come back
        assert s < 10 and int(r.headers["Retry-After"]) >= 1, (s, r.headers)
        error = r.json()["error"]
        assert error["code"] == "engine_unavailable" and "already waiting" in error["message"], r.text
    texts = [r.json()["choices"][0]["message"]["content"] for _, r in answered]
    assert all(same_text(t, want) for t in texts), (texts, want)
    entry = engine()
    cold = entry.get("cold_start_s")
    assert entry["state"] == "ready" and cold is not None and 0 < cold < 600, entry
    metrics = httpx.get(f"{release.service_url('control-plane', 8004)}/metrics", timeout=10).text
    assert 'serving_llm_cold_start_seconds_count{endpoint="idle",version="1"}' in metrics
    print(f"\nscale to zero: the idle engine at zero {asleep_s:.0f} s after its last answer "
          f"(scale_to_zero_after_s={IDLE_S}); {len(threads)} requests while asleep: {len(answered)} held and answered "
          f"as greedy generate (first after {min(s for s, _ in answered):.1f} s, last after "
          f"{max(s for s, _ in answered):.1f} s), {len(refused)} past the bound answered 503 with Retry-After in "
          f"{max(s for s, _ in refused):.2f} s, 0 lost; cold start (wake call to Ready pod) {cold:.1f} s")
    release.cli("endpoint", "remove", "--endpoint", "idle")
    wait_until(lambda: len(engines(release)) == 1, 60, "the idle engine's Deployment deleted", interval=0.5)
    release.cli("model", "remove", "--name", "tiny-idle", "--version", "1")


def test_removing_the_version_deletes_its_engine(release, deployed):
    assert len(engines(release)) == 1
    release.cli("endpoint", "remove", "--endpoint", "support")  # the adapter's: the base's engine stays
    start = time.monotonic()
    release.cli("endpoint", "remove", "--endpoint", "chat")
    wait_until(lambda: not engines(release) and not engine_services(release)
               and not release.cluster.get("hpa", "-n", NS, "-l", ENGINE_LABEL)["items"], 60,
               "the engine's Deployment, Service and HPA deleted", interval=0.5, on_timeout=release.describe)
    deleted_s = time.monotonic() - start
    wait_until(lambda: not engine_pods(release), 120, "the engine's pod gone", interval=1)
    release.cli("model", "remove", "--name", "support-bot", "--version", "1")
    release.cli("model", "remove", "--name", "tiny-llm", "--version", "1")
    print(f"\nengine deleted {deleted_s:.1f} s after `endpoint remove`, its pod gone "
          f"{time.monotonic() - start:.1f} s after")
