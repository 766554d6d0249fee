"""An engine's Deployment and headless Service: pure functions of its spec and the template.

- Names: ``<release>-llm-<model>-v<version>-<8 hex of the key>``, a DNS label (63 characters at most)
  that two keys never share; the key itself is an annotation (label values cannot hold ``:`` or ``@``).
- Pods: an init container of the platform's image fetches the folder (and each LoRA adapter's) from
  the registry's artifacts into an emptyDir; vLLM's OpenAI server serves it on every pod address with
  the same flags the one-machine launcher gives (launch/process.py's ``vllm_command``), adapters as
  ``--lora-modules``.
- A change of what the pods run (options, folder, adapters, image) changes the pod template's hash:
  the Deployment is replaced by a rolling update that keeps the old pods until new ones are ready, so
  no request is lost (the one-machine launcher's replacement.py, done by Kubernetes).
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from serving.llm.launch.process import EngineSpec, engine_env, vllm_command
from serving.llm.kube.template import EngineTemplate

MANAGED_BY = "serving-control-plane"
KEY_ANNOTATION = "serving.io/engine-key"
HASH_ANNOTATION = "serving.io/pod-template-hash"
MODELS = "/models"
PRE_STOP_S = 5


def engine_name(release: str, key: str) -> str:
    """A DNS-1035 label: lowercase letters, digits and '-', starting with a letter, at most 63."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    model, _, rest = key.partition(":")
    version = rest.split("@", 1)[0]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{model}-v{version}".lower()).strip("-")
    head = re.sub(r"[^a-z0-9-]+", "-", f"{release}-llm".lower()).strip("-")
    room = 63 - len(head) - len(digest) - 2
    name = f"{head}-{slug[:max(room, 0)].strip('-')}-{digest}" if room > 0 else f"llm-{digest}"
    return name if name[0].isalpha() else f"e{name}"[:63]


def selector(release: str) -> dict[str, str]:
    """What every engine of this release carries (and nothing else has)."""
    return {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/component": "llm-engine",
            "serving.io/release": release}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def owned(body: dict[str, Any], owner: dict[str, Any] | None) -> dict[str, Any]:
    """``body`` owned by ``owner`` (the control plane's Deployment): deleting the release deletes its engines."""
    if owner:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    return body


def deployment(spec: EngineSpec, template: EngineTemplate, kv_cache_gb: float | None = None) -> dict[str, Any]:
    t = template.for_options(spec.options)
    name = engine_name(t.release, spec.key)
    labels = {**selector(t.release), "serving.io/engine": name}
    pod = _pod(spec, t, labels, kv_cache_gb)
    pod_hash = hashlib.sha256(json.dumps(pod, sort_keys=True).encode()).hexdigest()[:16]
    pod["metadata"]["annotations"][HASH_ANNOTATION] = pod_hash
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {KEY_ANNOTATION: spec.key, HASH_ANNOTATION: pod_hash}},
        "spec": {"replicas": spec.replicas, "selector": {"matchLabels": {"serving.io/engine": name}},
                 # old pods serve until new ones are ready: a replaced engine loses no request
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": pod},
    }


def service(spec: EngineSpec, template: EngineTemplate) -> dict[str, Any]:
    """Headless: the engine's pods by name (the pods' own addresses reach the workers through GET /engines)."""
    name = engine_name(template.release, spec.key)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {**selector(template.release), "serving.io/engine": name},
                     "annotations": {KEY_ANNOTATION: spec.key}},
        "spec": {"clusterIP": "None", "selector": {"serving.io/engine": name},
                 "ports": [{"name": "http", "port": template.port, "targetPort": "http", "protocol": "TCP"}]},
    }


def hpa(spec: EngineSpec, template: EngineTemplate) -> dict[str, Any]:
    """The engine's HPA on its own signals: External metrics selected by the engine's label, which the
    control plane's metrics API reads from this engine's pods (registry/autoscaling/engine_signals.py)."""
    a = template.autoscaling
    assert a is not None
    name = engine_name(template.release, spec.key)
    metrics = [{"type": "External", "external": {
        "metric": {"name": metric, "selector": {"matchLabels": {"serving.io/engine": name}}},
        "target": {"type": kind, ("averageValue" if kind == "AverageValue" else "value"): _quantity(value)}}}
        for metric, kind, value in a.targets()]
    body: dict[str, Any] = {
        "apiVersion": a.api_version, "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": {**selector(template.release), "serving.io/engine": name},
                     "annotations": {KEY_ANNOTATION: spec.key}},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "minReplicas": a.min_replicas, "maxReplicas": max(a.max_replicas, a.min_replicas),
                 "metrics": metrics}}
    if a.behavior:
        body["spec"]["behavior"] = a.behavior
    body["metadata"]["annotations"][HASH_ANNOTATION] = hashlib.sha256(
        json.dumps(body["spec"], sort_keys=True).encode()).hexdigest()[:16]
    return body


def _quantity(value: float) -> str:
    return f"{round(value * 1000)}m" if value != int(value) else str(int(value))


def _pod(spec: EngineSpec, t: EngineTemplate, labels: dict[str, str], kv_cache_gb: float | None) -> dict[str, Any]:
    adapters = sorted(spec.adapters.items())
    command = vllm_command(t.python, spec, f"{MODELS}/model", t.port,
                           t.kv_cache_gb if t.kv_cache_gb is not None else kv_cache_gb, t.extra_args, host="0.0.0.0")
    if adapters:
        command += ["--lora-modules", *[f"{name}={MODELS}/adapters/{_dir(name)}" for name, _ in adapters]]
    fetch = ["python", "-m", "serving.llm.kube.fetch_model", "--into", MODELS, "--artifact", spec.artifact,
             *[a for name, sha in adapters for a in ("--adapter", f"{_dir(name)}={sha}")]]
    mounts = [{"name": "models", "mountPath": MODELS}]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 5}
    resources = {k: dict(v) for k, v in t.resources.items()}
    if t.gpus:
        resources["limits"] = {**resources.get("limits", {}), "nvidia.com/gpu": t.gpus}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        "initContainers": [{"name": "model", "image": t.init_image, "imagePullPolicy": t.init_pull_policy,
                            "command": fetch, "env": _init_env(t), "volumeMounts": mounts,
                            "terminationMessagePolicy": "FallbackToLogsOnError"}],
        "containers": [{
            "name": "vllm", "image": t.image, "imagePullPolicy": t.pull_policy, "command": command,
            "terminationMessagePolicy": "FallbackToLogsOnError",  # its last log lines: why it failed
            "env": [{"name": k, "value": v} for k, v in sorted({**engine_env(spec), **t.env}.items())],
            "ports": [{"name": "http", "containerPort": t.port, "protocol": "TCP"}],
            "startupProbe": {**probe, "failureThreshold": max(1, t.startup_seconds // 5)},
            "readinessProbe": probe, "livenessProbe": {**probe, "periodSeconds": 15},
            "resources": resources,
            # a pod being deleted leaves GET /engines at once; the workers' map is a few seconds old: it
            # keeps serving until they have stopped sending to it
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
            "volumeMounts": [{**mounts[0], "readOnly": True}, {"name": "dshm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "models", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": t.shm_size}}],
    }
    if t.node_selector:
        pod_spec["nodeSelector"] = dict(t.node_selector)
    if t.tolerations:
        pod_spec["tolerations"] = [dict(x) for x in t.tolerations]
    return {"metadata": {"labels": labels, "annotations": {KEY_ANNOTATION: spec.key}}, "spec": pod_spec}


def _init_env(t: EngineTemplate) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "SERVING_CONTROL_PLANE_URL", "value": t.control_plane_url}]
    if t.worker_token is not None:
        env.append({"name": "SERVING_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": t.worker_token.name, "key": t.worker_token.key}}})
    return env


def _dir(adapter: str) -> str:
    """An adapter's folder name (its name holds ':')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", adapter)
