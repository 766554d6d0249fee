"""The settings the compose file and the chart pass are the ones the code reads.

Expected names are derived from serving/settings.py's pydantic-settings classes
(``SERVING_`` + field name), never listed by hand, so a renamed or removed setting
fails here instead of being silently ignored by a deployed process.
"""
from __future__ import annotations

import pytest

from tests.deploy.artifacts import (
    VALUES_FILES, component, compose, container_env, env_names, find, host_port, manifests, service_env,
    settings_classes,
)

# What each component cannot run without in a multi-container deployment (the defaults are
# loopback addresses, right only when everything shares one host).
REQUIRED = {
    "control-plane": {"SERVING_HOME", "SERVING_DATABASE_URL", "SERVING_CONTROL_PLANE_HOST",
                      "SERVING_CONTROL_PLANE_PORT", "SERVING_TRITON_MODEL_REPOSITORY",
                      "SERVING_TRITON_CONTROL_URL"},
    "worker": {"SERVING_HOME", "SERVING_CONTROL_PLANE_URL", "SERVING_WORKER_HOST", "SERVING_WORKER_PORT",
               "SERVING_TRITON_GRPC_URL"},
    "statistics": {"SERVING_HOME", "SERVING_CONTROL_PLANE_URL", "SERVING_STATISTICS_HOST",
                   "SERVING_STATISTICS_PORT"},
}


def unknown_settings(component_name: str, env: dict[str, str]) -> set[str]:
    """SERVING_* names in ``env`` that the component's settings class does not read."""
    return {k for k in env if k.startswith("SERVING_")} - env_names(settings_classes()[component_name])


def test_unknown_settings_catches_a_misspelt_name():
    assert unknown_settings("worker", {"SERVING_WORKER_PORT": "1", "SERVING_WORKER_PROT": "1"}) == \
        {"SERVING_WORKER_PROT"}
    assert unknown_settings("worker", {"SERVING_DATABASE_URL": "x"}) == {"SERVING_DATABASE_URL"}


# --- compose ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_compose_passes_only_settings_the_service_reads(name):
    env = service_env(compose()["services"][name])
    assert not unknown_settings(name, env)
    assert REQUIRED[name] <= env.keys()


def test_compose_addresses_point_at_the_right_services_and_ports():
    services = compose()["services"]
    cp, worker, stats = (service_env(services[n]) for n in ("control-plane", "worker", "statistics"))
    cp_port = int(cp["SERVING_CONTROL_PLANE_PORT"])
    for env in (worker, stats):
        assert host_port(env["SERVING_CONTROL_PLANE_URL"]) == ("control-plane", cp_port)
        assert env["SERVING_KAFKA_BOOTSTRAP_SERVERS"] == worker["SERVING_KAFKA_BOOTSTRAP_SERVERS"]
        assert env["SERVING_KAFKA_TOPIC"] == worker["SERVING_KAFKA_TOPIC"]
    assert f"{cp_port}" == services["control-plane"]["ports"][0].rsplit(":", 1)[1]
    assert f"{stats['SERVING_STATISTICS_PORT']}" == services["statistics"]["ports"][0].rsplit(":", 1)[1]
    assert worker["SERVING_WORKER_PORT"] in services["worker"]["expose"]
    assert host_port(cp["SERVING_DATABASE_URL"]) == ("postgres", 5432)
    # the web console's figures (and rollout gates) from the statistics service, its playground to the workers
    assert host_port(cp["SERVING_STATISTICS_URL"]) == ("statistics", int(stats["SERVING_STATISTICS_PORT"]))
    assert host_port(cp["SERVING_CONSOLE_DATA_PLANE_URL"]) == ("worker", int(worker["SERVING_WORKER_PORT"]))

    kafka = services["kafka"]["environment"]
    assert f"PLAINTEXT://{worker['SERVING_KAFKA_BOOTSTRAP_SERVERS']}" in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")

    triton = services["triton"]["command"]
    assert f"--grpc-port={host_port(worker['SERVING_TRITON_GRPC_URL'])[1]}" in triton
    assert host_port(worker["SERVING_TRITON_GRPC_URL"])[0] == "triton"
    assert host_port(cp["SERVING_TRITON_CONTROL_URL"]) == ("triton", int(_flag(triton, "--http-port")))


def test_compose_control_plane_and_triton_share_the_model_repository():
    services = compose()["services"]
    repo = service_env(services["control-plane"])["SERVING_TRITON_MODEL_REPOSITORY"]
    assert _flag(services["triton"]["command"], "--model-repository") == repo
    assert _flag(services["triton"]["command"], "--model-control-mode") == "explicit"
    cp_volume = _volume_at(services["control-plane"], repo)
    assert cp_volume and cp_volume == _volume_at(services["triton"], repo)


def _flag(args: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]
    return value


def _volume_at(service: dict, path: str) -> str | None:
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        if target == path:
            return source
    return None


# --- the chart ------------------------------------------------------------------------------

# containers beside a component's own in its pod, each reading settings of its own
SIDECARS = {"llm-launcher": {"SERVING_CONTROL_PLANE_URL", "SERVING_LLM_ON_KUBERNETES", "SERVING_LLM_KUBE_ENGINE",
                             "SERVING_LLM_LAUNCHER_HOST", "SERVING_LLM_LAUNCHER_PORT"}}


def serving_containers(docs):
    for doc in find(docs, "Deployment"):
        if component(doc) in REQUIRED:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield (c["name"] if c["name"] in SIDECARS else component(doc)), doc, c


@pytest.mark.parametrize("kind", list(VALUES_FILES))
def test_chart_passes_only_settings_the_component_reads(kind):
    docs = manifests(kind)
    seen = set()
    per_pod = triton_per_pod(docs)
    for name, doc, container in serving_containers(docs):
        env = container_env(docs, doc, container)
        assert not unknown_settings(name, env), name
        required = {**REQUIRED, **SIDECARS}[name] - ({"SERVING_TRITON_CONTROL_URL"} if per_pod else set())
        assert required <= env.keys(), (name, required - env.keys())  # per-pod Triton: each pod loads its own
        seen.add(name)
    assert set(REQUIRED) <= seen <= set(REQUIRED) | set(SIDECARS)


@pytest.mark.parametrize("kind", list(VALUES_FILES))
def test_chart_ports_and_addresses_agree_with_the_settings(kind):
    docs = manifests(kind)
    env = {name: container_env(docs, doc, c) for name, doc, c in serving_containers(docs)}
    ports = {name: c["ports"][0]["containerPort"] for name, _, c in serving_containers(docs)}
    assert ports["control-plane"] == int(env["control-plane"]["SERVING_CONTROL_PLANE_PORT"])
    assert ports["worker"] == int(env["worker"]["SERVING_WORKER_PORT"])
    assert ports["statistics"] == int(env["statistics"]["SERVING_STATISTICS_PORT"])

    services = {s["metadata"]["name"]: s for s in find(docs, "Service")}
    for name in ("worker", "statistics"):
        host, port = host_port(env[name]["SERVING_CONTROL_PLANE_URL"])
        assert component(services[host]) == "control-plane"
        assert port in {p["port"] for p in services[host]["spec"]["ports"]}
    # the web console's figures (and rollout gates) from the statistics Service, its playground to the workers'
    for setting, target in (("SERVING_STATISTICS_URL", "statistics"), ("SERVING_CONSOLE_DATA_PLANE_URL", "worker")):
        host, port = host_port(env["control-plane"][setting])
        assert component(services[host]) == target, setting
        assert port in {p["port"] for p in services[host]["spec"]["ports"]}, setting

    (triton,) = [d for d in find(docs, "Deployment") if component(d) == "triton"]
    args = triton["spec"]["template"]["spec"]["containers"][0]["args"]
    per_pod = triton_per_pod(docs)
    for setting, flag in (("SERVING_TRITON_GRPC_URL", "--grpc-port"), ("SERVING_TRITON_CONTROL_URL", "--http-port")):
        if per_pod and setting == "SERVING_TRITON_CONTROL_URL":
            assert setting not in env["control-plane"]  # the control plane loads nothing: each pod loads its own
            continue
        source = env["worker"] if setting == "SERVING_TRITON_GRPC_URL" else env["control-plane"]
        host, port = host_port(source[setting])
        # several Triton pods (or an HPA adding them): the workers resolve the headless Service's every address
        expected = "triton-pods" if source[setting].startswith("dns:///") else "triton"
        assert component(services[host]) == expected and port == int(_flag(args, flag))
    assert _flag(args, "--model-control-mode") == "explicit"


def triton_per_pod(docs: list[dict]) -> bool:
    """Whether each Triton pod loads its own models (serving.tritonPerPod): the workers then reach every pod."""
    (cm,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("-serving-worker")]
    return cm["data"]["SERVING_TRITON_GRPC_URL"].startswith("dns:///")


def test_chart_control_plane_and_triton_mount_one_model_repository():
    docs = manifests("default")
    mounts = {}
    for doc in find(docs, "Deployment"):
        pod = doc["spec"]["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        for m in pod["containers"][0]["volumeMounts"]:
            if m["name"] in claims:
                mounts[(component(doc), m["mountPath"])] = claims[m["name"]]
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    repo = env["control-plane"]["SERVING_TRITON_MODEL_REPOSITORY"]
    (triton,) = [d for d in find(docs, "Deployment") if component(d) == "triton"]
    assert _flag(triton["spec"]["template"]["spec"]["containers"][0]["args"], "--model-repository") == repo
    assert mounts[("control-plane", repo)] == mounts[("triton", repo)]
    assert mounts[("control-plane", env["control-plane"]["SERVING_HOME"])] != mounts[("control-plane", repo)]


def test_chart_database_and_kafka_addresses():
    import base64

    docs = manifests("default")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    secret_ref = env["control-plane"]["SERVING_DATABASE_URL"].removeprefix("secret:")
    secret_name, key = secret_ref.split("/")
    (secret,) = find(docs, "Secret", secret_name)
    url = base64.b64decode(secret["data"][key]).decode()
    password = base64.b64decode(secret["data"]["postgres-password"]).decode()
    assert url.startswith(f"postgresql://serving:{password}@demo-serving-postgresql:5432/registry")
    (pg,) = find(docs, "StatefulSet", "demo-serving-postgresql")
    assert pg["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 5432

    host, port = host_port(env["worker"]["SERVING_KAFKA_BOOTSTRAP_SERVERS"])
    (kafka,) = find(docs, "StatefulSet", host)
    kenv = {e["name"]: e.get("value") for e in kafka["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert f"PLAINTEXT://{host}:{port}" in kenv["KAFKA_ADVERTISED_LISTENERS"]
    assert "controller" in kenv["KAFKA_PROCESS_ROLES"]
    assert env["statistics"]["SERVING_KAFKA_BOOTSTRAP_SERVERS"] == env["worker"]["SERVING_KAFKA_BOOTSTRAP_SERVERS"]


def test_chart_external_services_are_passed_through():
    vals = VALUES_FILES["external-db"].read_text()
    docs = manifests("external-db")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    assert env["control-plane"]["SERVING_DATABASE_URL"] == "secret:registry-database/database-url"
    assert not find(docs, "Secret", "demo-serving-database"), "the user's Secret, not one of the chart's"
    assert env["worker"]["SERVING_KAFKA_BOOTSTRAP_SERVERS"] in vals


def test_chart_stores_an_external_database_url_in_a_secret_of_its_own():
    import base64
    import secrets

    url = f"postgresql://serving:{secrets.token_hex(8)}@postgres.databases.svc:5432/registry"
    docs = manifests("external-db", f"externalDatabase: {{url: '{url}', existingSecret: ''}}")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    name, key = env["control-plane"]["SERVING_DATABASE_URL"].removeprefix("secret:").split("/")
    assert base64.b64decode(find(docs, "Secret", name)[0]["data"][key]).decode() == url


def test_chart_without_kafka_sends_statistics_over_http_to_the_statistics_service():
    docs = manifests("default", "kafka: {enabled: false}")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    assert "SERVING_KAFKA_BOOTSTRAP_SERVERS" not in env["worker"]
    (svc,) = find(docs, "Service", env["worker"]["SERVING_STATISTICS_HOST"])
    assert component(svc) == "statistics"
    assert int(env["worker"]["SERVING_STATISTICS_PORT"]) in {p["port"] for p in svc["spec"]["ports"]}


def test_chart_without_any_database_uses_sqlite_on_the_control_plane_volume():
    docs = manifests("default", "postgresql: {enabled: false}")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    assert "SERVING_DATABASE_URL" not in env["control-plane"]
    assert [component(s) for s in find(docs, "Secret")] == ["tokens"]  # no database Secret


def test_chart_tokens_come_from_a_secret_never_from_values():
    docs = manifests("default")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    (secret,) = [s for s in find(docs, "Secret") if component(s) == "tokens"]
    name = secret["metadata"]["name"]
    assert env["control-plane"]["SERVING_ADMIN_TOKEN"] == f"secret:{name}/admin-token"
    for n in ("control-plane", "worker", "statistics"):
        assert env[n]["SERVING_WORKER_TOKEN"] == f"secret:{name}/worker-token"
    docs = manifests("default", "auth: {existingSecret: my-tokens}")
    env = {n: container_env(docs, d, c) for n, d, c in serving_containers(docs)}
    assert not [s for s in find(docs, "Secret") if component(s) == "tokens"]
    assert env["worker"]["SERVING_WORKER_TOKEN"] == "secret:my-tokens/worker-token"


def service_link_env(service: dict) -> set[str]:
    """The variables Kubernetes injects into every pod of the namespace for a Service
    (docker-links style), unless the pod sets enableServiceLinks: false."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    names = {f"{name}_SERVICE_HOST", f"{name}_SERVICE_PORT", f"{name}_PORT"}
    for port in service["spec"]["ports"]:
        names.add(f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}")
        base = f"{name}_PORT_{port['port']}_{port.get('protocol', 'TCP')}"
        names |= {base, f"{base}_PROTO", f"{base}_PORT", f"{base}_ADDR"}
    return names


def test_service_links_cannot_shadow_settings_with_the_release_named_serving():
    # `helm install serving ...` (as the docs do) names the Services serving-<component>:
    # Kubernetes would then inject SERVING_STATISTICS_PORT=tcp://10.x.y.z:9999 into every pod,
    # which a worker with Kafka (it does not set that variable) would fail to parse as a port.
    docs = manifests("default", release="serving")
    injected = set().union(*(service_link_env(s) for s in find(docs, "Service")))
    clashes = {name: env_names(cls) & injected for name, cls in settings_classes().items()}
    assert clashes["worker"] >= {"SERVING_STATISTICS_PORT"}, "the hazard this test guards against"
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            assert doc["spec"]["template"]["spec"]["enableServiceLinks"] is False, doc["metadata"]["name"]
