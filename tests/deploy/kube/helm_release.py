"""The chart installed for real into the test cluster: shared by test_helm_install.py and test_operations.py.

- ``images_in_node``: the platform images (built under a tag of the run, or ``SERVING_TEST_BUILD=0`` with
  ``SERVING_TEST_IMAGE_TAG``) copied into the node's containerd.
- ``installed``: ``helm install --wait`` of helm/serving with ``chart_values`` (plus a module's own
  overrides), yielding a ``Release``; uninstalled and its namespace deleted afterwards.
- ``deploy_clf``: the CLI's upload / add / key create of the tiny model as endpoint ``clf``.
"""
from __future__ import annotations

import base64
import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import yaml

from tests.deploy import platform_images
from tests.deploy.artifacts import CHART, REPO
from tests.deploy.engine import engine_env, why_not
from tests.support.ci import cannot_run
from tests.support.kube import images, storage, tools
from tests.support.procs import wait_until

NS, RELEASE = "serving-test", "demo"


@contextlib.contextmanager
def images_in_node(kube_cluster) -> Iterator[dict[str, str]]:
    """The images, built under a tag of this run, in the node. ``SERVING_TEST_BUILD=0``: those already built
    under ``SERVING_TEST_IMAGE_TAG`` (default latest), e.g. by the compose test or scripts/images.sh."""
    why = why_not()
    if why:
        cannot_run(f"the platform images cannot be built here: {why}")
    env = engine_env()
    prebuilt = os.environ.get("SERVING_TEST_BUILD") == "0"
    tag = os.environ.get("SERVING_TEST_IMAGE_TAG", "latest") if prebuilt else f"kube-{uuid.uuid4().hex[:8]}"
    try:
        if prebuilt:
            names, build_s = platform_images.image_names(tag), 0.0
        else:
            names, build_s = platform_images.build(tag, env)
        kube_cluster.timings["images build"] = build_s
        start = time.monotonic()
        for key in ("SERVING_IMAGE", "SERVING_TRITON_IMAGE", "SERVING_STANDIN_POSTGRES_IMAGE",
                    "SERVING_STANDIN_KAFKA_IMAGE"):
            images.import_podman_image(kube_cluster, names[key], env)
        kube_cluster.timings["images into the node"] = time.monotonic() - start
        yield names
    finally:
        if not prebuilt:
            platform_images.untag(platform_images.image_names(tag), env)


def repo_tag(image: str) -> dict[str, str]:
    repository, tag = image.rsplit(":", 1)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def chart_values(names: dict[str, str]) -> dict:
    """The chart's defaults but for the images (see test_helm_install.py's docstring) and smaller CPU
    requests: the defaults ask for 2.0 CPUs in all, the whole of this 2-core node."""
    small = {"requests": {"cpu": "50m", "memory": "128Mi"}}
    return {
        "image": repo_tag(names["SERVING_IMAGE"]),
        "triton": {"mode": "embedded", "embedded": {"image": repo_tag(names["SERVING_TRITON_IMAGE"])},
                   "resources": {**small, "limits": {"memory": "4Gi"}}},
        "postgresql": {"image": repo_tag(names["SERVING_STANDIN_POSTGRES_IMAGE"]), "resources": small},
        "kafka": {"image": repo_tag(names["SERVING_STANDIN_KAFKA_IMAGE"]), "resources": small},
        "controlPlane": {"resources": small},
        "worker": {"resources": small},
        "statistics": {"resources": small},
    }


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class Release:
    def __init__(self, cluster, values_file: Path) -> None:
        self.cluster, self.values_file = cluster, values_file
        self.admin_token = ""
        self.client_key = ""

    def helm(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([tools.exe("helm"), f"--kubeconfig={self.cluster.kubeconfig}", "-n", NS, *args],
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}\n"
                                 f"{self.describe()}")
        return out

    def describe(self) -> str:
        pods = self.cluster.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False).stdout
        events = self.cluster.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False).stdout
        logs = []
        for pod in self.cluster.get("pods", "-n", NS)["items"]:
            name = pod["metadata"]["name"]
            if not all(c.get("ready") for c in pod["status"].get("containerStatuses", [])):
                logs.append(f"--- {name}\n" + self.cluster.kubectl("logs", "-n", NS, name, "--tail=30",
                                                                   "--all-containers", check=False).stdout)
        return f"{pods}\n{events[-3000:]}\n" + "\n".join(logs) + "\n" + self.cluster.tail("kubelet", 15)

    def service_url(self, component: str, port: int) -> str:
        svc = self.cluster.get("service", f"{RELEASE}-serving-{component}", "-n", NS)
        return f"http://{svc['spec']['clusterIP']}:{port}"

    def pods(self, component: str) -> list[dict]:
        return self.cluster.get("pods", "-n", NS, "-l", f"app.kubernetes.io/component={component}")["items"]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "serving.cli.main", "--control-plane", self.service_url("control-plane", 8080),
               *args]
        out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "SERVING_TOKEN": self.admin_token},
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, f"serving {' '.join(args)}: {out.stdout}\n{out.stderr}"
        return out

    def worker(self) -> httpx.Client:
        return httpx.Client(base_url=self.service_url("worker", 9090), timeout=30,
                            headers={"Authorization": f"Bearer {self.client_key}"})


@contextlib.contextmanager
def installed(kube_cluster, names: dict[str, str], tmp_dir: Path, extra: dict | None = None) -> Iterator[Release]:
    # an earlier module's release on the same cluster: its namespace may still be terminating (slow under load)
    wait_until(lambda: kube_cluster.kubectl("get", "namespace", NS, check=False).returncode != 0, 600,
               f"namespace {NS} of an earlier release to be gone", interval=2)
    storage.provide(kube_cluster, count=8)
    values_file = tmp_dir / "values.yaml"
    values_file.write_text(yaml.safe_dump(merged(chart_values(names), extra or {})))
    rel = Release(kube_cluster, values_file)
    start = time.monotonic()
    try:
        rel.helm("install", RELEASE, str(CHART), "--create-namespace", "-f", str(values_file), "--wait",
                 "--timeout", "12m", timeout=800)
        kube_cluster.timings["helm install --wait"] = time.monotonic() - start
        secrets = kube_cluster.get("secrets", "-n", NS)["items"]
        (auth,) = [s for s in secrets if "admin-token" in (s.get("data") or {})]
        rel.admin_token = base64.b64decode(auth["data"]["admin-token"]).decode()
        yield rel
    finally:
        rel.helm("uninstall", RELEASE, check=False, timeout=300)
        kube_cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", check=False, timeout=240)


def wait_ready(release: Release, what: str) -> None:
    def ready() -> bool:
        with release.worker() as client:
            return client.get("/v2/models/clf/ready").status_code == 200
    wait_until(ready, 180, what, interval=1, on_timeout=release.describe)


def deploy_clf(release: Release, tiny_model) -> None:
    """clf:1 uploaded and added with the CLI, a client key for it in ``release.client_key``, ready behind
    the workers' Service."""
    release.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
    release.cli("model", "add", "--endpoint", "clf", "--model", "clf:1", "--tokenizer", str(tiny_model.tokenizer_dir),
                "--labels", ",".join(tiny_model.labels))
    created = release.cli("key", "create", "--name", "kube-test", "--endpoints", "clf").stdout
    (release.client_key,) = re.findall(r"\bsk_[0-9a-f]{64}\b", created)
    wait_ready(release, "clf ready behind the workers' Service")
