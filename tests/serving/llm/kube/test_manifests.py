"""An engine's Deployment and Service as the control plane's launcher makes them (serving/llm/kube/manifests.py)."""
from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from serving.llm.checks import EngineOptions, options_from_aux
from serving.llm.kube import manifests
from serving.llm.kube.template import EngineTemplate
from serving.llm.launch.process import wanted_engines
from serving.llm.naming import engine_key

SHA, ADAPTER_SHA = "a" * 64, "b" * 64
TEMPLATE = EngineTemplate.model_validate({
    "release": "demo-serving", "image": "vllm/vllm-openai:v0.32.0", "initImage": "serving:1",
    "controlPlaneUrl": "http://demo-serving-control-plane:8080", "workerToken": {"name": "tokens", "key": "worker-token"},
    "gpus": 1, "resources": {"requests": {"cpu": "2", "memory": "16Gi"}}, "nodeSelector": {"gpu": "a100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}], "extraArgs": ["--enable-prefix-caching"]})
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def snapshot(options: dict, adapters: bool = False) -> dict:
    targets = [{"model": "tiny-llama", "version": 3, "artifact": SHA}]
    if adapters:
        targets.append({"model": "tiny-lora", "version": 1, "artifact": ADAPTER_SHA,
                        "signature": {"lora": {"base": {"name": "tiny-llama", "version": 3, "artifact": SHA}, "rank": 8}}})
    return {"revision": 1, "endpoints": {"chat": {"engine": "vllm", "engine_options": options, "targets": targets}}}


def only(options: dict, adapters: bool = False):
    (spec,) = wanted_engines(snapshot(options, adapters)).values()
    return spec


def pod(body: dict) -> dict:
    return body["spec"]["template"]["spec"]


def test_names_are_dns_labels_unique_per_engine_and_stable():
    keys = ["tiny-llama:3", "tiny-llama:3@0123abcd", "Tiny_Llama:3", "x" * 200 + ":12@deadbeef", "9lives:1"]
    names = [manifests.engine_name("demo-serving", k) for k in keys]
    for name in names:
        assert len(name) <= 63 and DNS_1035.fullmatch(name), name
    assert len(set(names)) == len(keys)
    assert manifests.engine_name("demo-serving", "tiny-llama:3") == manifests.engine_name("demo-serving", "tiny-llama:3")
    assert manifests.engine_name("demo-serving", "tiny-llama:3").startswith("demo-serving-llm-tiny-llama-v3-")


def test_the_pod_fetches_the_folder_then_runs_vllm_with_the_versions_options_on_every_address():
    spec = only({"dtype": "float32", "max_model_len": 256, "extra_args": ["--seed", "7"], "replicas": 2})
    body = manifests.deployment(spec, TEMPLATE)
    assert body["spec"]["replicas"] == 2
    assert body["metadata"]["annotations"][manifests.KEY_ANNOTATION] == spec.key
    (init,) = pod(body)["initContainers"]
    assert init["image"] == "serving:1" and init["command"][-2:] == ["--artifact", SHA]
    assert {"name": "SERVING_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tokens", "key": "worker-token"}}} \
        in init["env"]
    (vllm,) = pod(body)["containers"]
    cmd = vllm["command"]
    pairs = dict(zip(cmd, cmd[1:]))
    assert pairs["--model"] == "/models/model" and pairs["--host"] == "0.0.0.0" and pairs["--port"] == "8000"
    assert pairs["--served-model-name"] == spec.key and pairs["--dtype"] == "float32"
    assert pairs["--max-model-len"] == "256"
    # the chart's flags first, the version's after (vLLM takes the last of a flag given twice)
    assert cmd.index("--enable-prefix-caching") < cmd.index("--seed")
    assert "--kv-cache-memory-bytes" not in cmd  # on GPUs vLLM sizes the cache
    assert vllm["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert pod(body)["nodeSelector"] == {"gpu": "a100"} and pod(body)["tolerations"][0]["operator"] == "Exists"
    assert body["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_cpu_engine_gets_the_kv_cache_size():
    cpu = TEMPLATE.model_copy(update={"gpus": 0, "kv_cache_gb": 0.5})
    vllm = pod(manifests.deployment(only({}), cpu))["containers"][0]
    assert vllm["command"][vllm["command"].index("--kv-cache-memory-bytes") + 1] == str(1 << 29)
    assert "limits" not in vllm["resources"]


def test_adapters_are_fetched_and_named_to_vllm():
    body = manifests.deployment(only({}, adapters=True), TEMPLATE)
    init, vllm = pod(body)["initContainers"][0], pod(body)["containers"][0]
    assert init["command"][-2:] == ["--adapter", f"tiny-lora_1={ADAPTER_SHA}"]
    cmd = vllm["command"]
    assert cmd[cmd.index("--lora-modules") + 1] == "tiny-lora:1=/models/adapters/tiny-lora_1"
    assert "--enable-lora" in cmd
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in vllm["env"]


def test_pods_change_with_what_they_run_not_with_their_number():
    def pod_hash(options: dict, adapters: bool = False) -> str:
        return manifests.deployment(only(options, adapters), TEMPLATE)["metadata"]["annotations"][manifests.HASH_ANNOTATION]

    base = pod_hash({})
    assert pod_hash({"replicas": 3}) == base
    assert pod_hash({}, adapters=True) != base
    assert pod_hash({"image": "my/vllm:2"}) != base
    assert pod_hash({"gpus": 2}) != base


def test_a_versions_aux_config_sets_its_pods():
    options = EngineOptions(**options_from_aux({"image": "my/vllm:2", "gpus": "2", "cpu": "4", "memory": "32Gi"}))
    spec = only(options.model_dump(exclude_none=True))
    vllm = pod(manifests.deployment(spec, TEMPLATE))["containers"][0]
    assert vllm["image"] == "my/vllm:2"
    assert vllm["resources"] == {"requests": {"cpu": "4", "memory": "32Gi"},
                                 "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": 2}}
    # where it runs is not what it computes: the engine's key (its served name) stays the version's own
    assert spec.key == engine_key("tiny-llama", 3) == "tiny-llama:3"


def test_bad_pod_options_are_refused_naming_the_option():
    with pytest.raises(ValidationError, match="memory"):
        EngineOptions(memory="lots")
    with pytest.raises(ValidationError, match="gpus"):
        EngineOptions(gpus=-1)


def test_the_service_is_headless_over_the_engines_pods():
    spec = only({})
    svc = manifests.service(spec, TEMPLATE)
    dep = manifests.deployment(spec, TEMPLATE)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert set(svc["spec"]["selector"].items()) <= set(dep["spec"]["template"]["metadata"]["labels"].items())


def test_a_template_typo_is_named():
    with pytest.raises(ValidationError, match="gpuz"):
        EngineTemplate.model_validate({**TEMPLATE.model_dump(by_alias=True), "gpuz": 1})


@pytest.mark.parametrize("adapters", [False, True])
def test_both_objects_match_the_kubernetes_schema(adapters):
    """Strict (no unknown field) against the oldest schemas bundled offline; the cluster test creates them
    for real on 1.20 (tests/deploy/kube/test_llm_engines.py)."""
    import kubernetes_validate

    from tests.deploy.artifacts import KUBE_VERSION

    spec = only({"gpus": 1, "cpu": "4"}, adapters)
    for doc in (manifests.deployment(spec, TEMPLATE), manifests.service(spec, TEMPLATE)):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_an_engines_hpa_scales_its_deployment_on_that_engines_own_signals():
    """External metrics whose selector names the engine (the control plane's metrics API reads that engine's
    pods: registry/autoscaling/engine_signals.py), targets and behavior from the values."""
    import kubernetes_validate

    from serving.llm.kube.template import EngineAutoscaling
    from tests.deploy.artifacts import KUBE_VERSION

    scaled = TEMPLATE.model_copy(update={"autoscaling": EngineAutoscaling.model_validate({
        "apiVersion": "autoscaling/v2", "minReplicas": 1, "maxReplicas": 3, "waitingRequestsPerReplica": 4,
        "ttftMilliseconds": 800.5, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}})})
    spec = only({})
    body, dep = manifests.hpa(spec, scaled), manifests.deployment(spec, scaled)
    kubernetes_validate.validate(body, KUBE_VERSION, strict=True)
    assert body["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": dep["metadata"]["name"]}
    engine = dep["spec"]["selector"]["matchLabels"]
    assert [(m["external"]["metric"]["name"], m["external"]["metric"]["selector"]["matchLabels"], m["external"]["target"])
            for m in body["spec"]["metrics"]] == [
        ("serving_llm_waiting_requests", engine, {"type": "AverageValue", "averageValue": "4"}),
        ("serving_llm_ttft_ms", engine, {"type": "Value", "value": "800500m"})]
    assert (body["spec"]["minReplicas"], body["spec"]["maxReplicas"]) == (1, 3)
    assert body["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 30}}
