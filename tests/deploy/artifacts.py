"""Load what the deployment ships (chart renders, compose files, Dockerfile) and what the code reads.

The expected names come from the code itself: the pydantic-settings classes of
``serving/settings.py`` (prefix ``SERVING_``) and the commands of the ``serving`` CLI.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.compose_env import interpolate, read_env_file

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "serving"
DEPLOY = REPO / "deploy"
VALUES_FILES = {
    "default": None,
    "gpu": CHART / "ci" / "gpu-values.yaml",
    "external-db": CHART / "ci" / "external-db-values.yaml",
    "autoscaling": CHART / "ci" / "autoscaling-values.yaml",
    "llm": CHART / "ci" / "llm-values.yaml",
    "llm-engines": CHART / "ci" / "llm-engines-values.yaml",
    "keda": CHART / "ci" / "keda-values.yaml",
}
RELEASE, NAMESPACE = "demo", "ml"
KUBE_VERSION = "1.30.0"  # the oldest schemas validated offline (1.20 is installed for real: tests/deploy/kube)


# --- what the code reads --------------------------------------------------------------

def settings_classes() -> dict[str, type]:
    """Component (compose service / chart component label) -> the settings class it reads."""
    from serving.settings import ControlPlaneSettings, LLMSettings, StatisticsSettings, WorkerSettings

    return {"control-plane": ControlPlaneSettings, "worker": WorkerSettings, "statistics": StatisticsSettings,
            "llm-launcher": LLMSettings}  # the control plane pod's launcher of LLM engines (llmEngines)


def env_names(cls: type) -> set[str]:
    prefix = cls.model_config.get("env_prefix", "")
    return {f"{prefix}{name}".upper() for name in cls.model_fields}


def all_env_names() -> set[str]:
    from serving import settings

    classes = [v for v in vars(settings).values()
               if isinstance(v, type) and issubclass(v, settings.CommonSettings)]
    return set().union(*(env_names(c) for c in classes))


def cli_commands() -> set[str]:
    import typer.main

    from serving.cli.main import app

    return set(typer.main.get_command(app).commands)


# --- the Helm chart -----------------------------------------------------------------

def values(kind: str) -> dict[str, Any] | None:
    path = VALUES_FILES[kind]
    return None if path is None else yaml.safe_load(path.read_text())


@functools.lru_cache(maxsize=None)
def _render(kind: str, overrides: str, release: str) -> tuple[tuple[str, str], ...]:
    import helm_python as helm

    vals = values(kind) or {}
    vals = _merge(vals, yaml.safe_load(overrides) or {})
    with helm.Chart.load(CHART) as chart:
        return tuple(sorted(chart.render(vals or None, name=release, namespace=NAMESPACE).items()))


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def rendered_files(kind: str, overrides: str = "", release: str = RELEASE) -> dict[str, str]:
    return dict(_render(kind, overrides, release))


def manifests(kind: str, overrides: str = "", release: str = RELEASE) -> list[dict[str, Any]]:
    docs = []
    for name, text in rendered_files(kind, overrides, release).items():
        if name.endswith((".yaml", ".yml")):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def component(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def container_env(docs: list[dict], workload: dict, container: dict) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: envFrom ConfigMaps, then env.

    Secret references come back as ``secret:<name>/<key>``.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        (cm,) = find(docs, "ConfigMap", ref)
        env.update(cm["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return env


# --- compose --------------------------------------------------------------------------

def compose_env() -> dict[str, str]:
    """deploy/.env when deploy/init-env.sh made one, else the tracked template plus stand-in secrets."""
    if (DEPLOY / ".env").exists():
        return read_env_file(DEPLOY / ".env")
    secrets = {k: "test-secret" for k in ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD",
                                          "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")}
    return {**read_env_file(DEPLOY / ".env.example"), **secrets}


def compose(name: str = "docker-compose.yml", used: set[str] | None = None) -> dict[str, Any]:
    """A compose file as Compose sees it: YAML merge keys resolved, deploy/.env interpolated."""
    return interpolate(yaml.safe_load((DEPLOY / name).read_text()), compose_env(), used)


def service_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


# --- URLs and host:port strings ---------------------------------------------------------

def host_port(value: str) -> tuple[str, int]:
    value = value.removeprefix("dns:///")  # gRPC's name for every address of a (headless Service's) name
    m = re.fullmatch(r"(?:[a-z+]+://)?(?:[^@/]*@)?([^:/]+):(\d+)(?:/.*)?", value)
    assert m, f"not host:port or a URL with a port: {value!r}"
    return m.group(1), int(m.group(2))
