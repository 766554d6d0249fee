"""The Helm chart renders, lints and validates against the Kubernetes JSON schemas.

Tools: helm-python-sdk (Helm v4's Go SDK as a library: render + lint, offline) and
kubernetes-validate (the Kubernetes OpenAPI schemas, bundled; strict mode rejects
unknown fields). Nothing here talks to a cluster: there is none where CI runs.
"""
from __future__ import annotations

import pytest
import yaml

from tests.deploy.artifacts import CHART, KUBE_VERSION, NAMESPACE, RELEASE, VALUES_FILES, find, manifests, rendered_files, values

KINDS = list(VALUES_FILES)
# prometheus-operator CRDs have no schema in kubernetes-validate; the tests below check them.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
             ("keda.sh/v1alpha1", "ScaledObject"), ("keda.sh/v1alpha1", "TriggerAuthentication")}
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.mark.parametrize("kind", KINDS)
def test_chart_lints_clean(kind):
    import helm_python as helm

    report = helm.lint(CHART, values(kind), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("kind", KINDS)
def test_every_manifest_matches_the_kubernetes_schema(kind):
    import kubernetes_validate

    docs = manifests(kind)
    assert len(docs) >= 12
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({kind} values): {exc.message} at {list(exc.path)}")


def test_the_schema_check_can_fail():
    import kubernetes_validate

    (dep,) = [d for d in find(manifests("default"), "Deployment") if d["metadata"]["name"].endswith("-worker")]
    dep["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("kind", KINDS)
def test_standard_labels_and_selectors_match(kind):
    docs = manifests(kind)
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in WORKLOADS]
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            selector = doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        if doc["kind"] == "Service":
            matches = [p for p in pod_labels if doc["spec"]["selector"].items() <= p.items()]
            assert len(matches) == 1, f"Service {doc['metadata']['name']} selects {len(matches)} workloads"


def test_no_gpu_by_default_one_gpu_for_triton_with_gpu_values():
    def gpus(kind):
        return {c["name"]: c["resources"].get("limits", {}).get("nvidia.com/gpu")
                for d in find(manifests(kind), "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}

    assert not any(gpus("default").values())
    assert gpus("gpu") == {"control-plane": None, "worker": None, "statistics": None, "triton": 1}


def test_llm_values_run_vllms_image_on_a_gpu_as_an_external_engine():
    """No LLM engine by default; with llm.enabled, vLLM's own image requests nvidia.com/gpu, serves the claim's
    folder under the configured name, and its Service is the url an endpoint's engine options name."""
    assert not [d for d in find(manifests("default"), "Deployment") if d["metadata"]["name"].endswith("-llm")]
    docs = manifests("llm")
    (deployment,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == "demo-serving-llm"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("vllm/vllm-openai:v")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert args["model"] == "/models/my-llm" and args["served-model-name"] == "my-llm"
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert claims["model"] == "llm-models"
    (service,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == "demo-serving-llm"]
    port = service["spec"]["ports"][0]["port"]
    assert port == int(args["port"])
    from serving.llm.checks import check_options

    assert check_options({"url": f"http://demo-serving-llm:{port}/v1", "served_model_name": "my-llm"})


def test_llm_replicas_are_each_reachable_through_a_headless_service():
    """llm.replicas pods, and a headless Service (one DNS address per ready pod) that the workers resolve
    and route over (serving/llm/routing/external.py): the url the manifest's comment tells endpoints to name."""
    docs = manifests("llm", "llm: {autoscaling: {enabled: false}}")  # else its HPA owns the count
    (deployment,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == "demo-serving-llm"]
    assert deployment["spec"]["replicas"] == 2
    (pods,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == "demo-serving-llm-pods"]
    assert pods["spec"]["clusterIP"] == "None"
    assert pods["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert pods["metadata"]["labels"]["app.kubernetes.io/component"] == "llm-pods"
    assert pods["spec"]["ports"][0]["port"] == 8000
    text = rendered_files("llm")["serving/templates/llm.yaml"]
    assert "url=http://demo-serving-llm-pods:8000/v1 served_model_name=my-llm" in text


def test_autoscaling_values_add_hpas_for_the_workers_and_triton_on_their_own_signals():
    assert not find(manifests("default"), "HorizontalPodAutoscaler")
    docs = manifests("autoscaling")
    (hpa,) = find(docs, "HorizontalPodAutoscaler", f"{RELEASE}-serving-worker")
    (triton,) = find(docs, "HorizontalPodAutoscaler", f"{RELEASE}-serving-triton")
    assert [(m["external"]["metric"]["name"], m["external"]["target"]) for m in triton["spec"]["metrics"]] == [
        ("serving_triton_pending_requests", {"type": "AverageValue", "averageValue": "8"}),
        ("serving_triton_queue_ms", {"type": "Value", "value": "50"})]
    (triton_pods,) = find(docs, "Deployment", f"{RELEASE}-serving-triton")
    assert "replicas" not in triton_pods["spec"], "the HPA owns Triton's replica count"
    containers = {c["name"] for c in triton_pods["spec"]["template"]["spec"]["containers"]}
    assert "model-loader" in containers, "pods an HPA adds load their own models"
    (control_plane,) = find(docs, "Deployment", f"{RELEASE}-serving-control-plane")
    env = {e["name"]: e.get("value") for e in control_plane["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVING_AUTOSCALING_TRITON"] == f"{RELEASE}-serving-triton-pods:8002"
    (worker_cm,) = find(docs, "ConfigMap", f"{RELEASE}-serving-worker")
    assert worker_cm["data"]["SERVING_TRITON_GRPC_URL"].startswith("dns:///"), "workers follow the pods as they come"
    (target,) = find(docs, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
    assert target["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    assert "replicas" not in target["spec"], "the HPA owns the replica count"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 20)
    external, *resources = hpa["spec"]["metrics"]
    assert external == {"type": "External", "external": {"metric": {"name": "serving_worker_requests_in_flight"},
                                                         "target": {"type": "AverageValue", "averageValue": "8"}}}
    assert {m["resource"]["name"] for m in resources} == {"cpu", "memory"}  # CPU stays, as an extra signal
    assert target["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"], \
        "CPU utilization needs a CPU request"


def test_the_llm_engine_scales_on_waiting_requests_and_time_to_first_token():
    docs = manifests("llm")
    (hpa,) = find(docs, "HorizontalPodAutoscaler", f"{RELEASE}-serving-llm")
    assert [(m["external"]["metric"]["name"], m["external"]["target"]) for m in hpa["spec"]["metrics"]] == [
        ("serving_llm_waiting_requests", {"type": "AverageValue", "averageValue": "4"}),
        ("serving_llm_ttft_ms", {"type": "Value", "value": "800"})]
    (engine,) = find(docs, "Deployment", f"{RELEASE}-serving-llm")
    assert "replicas" not in engine["spec"]
    (control_plane,) = find(docs, "Deployment", f"{RELEASE}-serving-control-plane")
    env = {e["name"]: e.get("value") for e in control_plane["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVING_AUTOSCALING_LLM"] == f"{RELEASE}-serving-llm-pods:8000"


def test_the_metrics_api_is_an_apiservice_the_control_plane_serves_with_its_own_certificate(tmp_path):
    """The APIService names the control plane's Service on 443 with the CA of the certificate the control
    plane serves (valid for the Service's names); the HPA controller may read external metrics, the control
    plane the front-proxy CA in kube-system; the control plane samples the workers' headless Service."""
    import base64
    import subprocess

    assert not find(manifests("default"), "APIService")
    docs = manifests("autoscaling")
    (api,) = find(docs, "APIService")
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    service = api["spec"]["service"]
    assert (service["namespace"], service["port"]) == (NAMESPACE, 443)
    (svc,) = find(docs, "Service", service["name"])
    assert {"name": "metrics-api", "port": 443, "targetPort": "metrics-api", "protocol": "TCP"} in svc["spec"]["ports"]
    (secret,) = find(docs, "Secret", f"{RELEASE}-serving-metrics-api-tls")
    assert api["spec"]["caBundle"] == secret["data"]["ca.crt"]
    for name in ("ca.crt", "tls.crt"):
        (tmp_path / name).write_bytes(base64.b64decode(secret["data"][name]))
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stderr
    names = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, timeout=30).stdout
    assert f"DNS:{service['name']}.{NAMESPACE}.svc" in names
    (deployment,) = find(docs, "Deployment", service["name"])
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["SERVING_AUTOSCALING_WORKERS"] == f"{RELEASE}-serving-worker-pods:9090"
    assert env["SERVING_METRICS_API_PORT"] == "6443"
    (pods,) = find(docs, "Service", f"{RELEASE}-serving-worker-pods")
    assert pods["spec"]["clusterIP"] == "None"
    (reader,) = find(docs, "ClusterRoleBinding")
    assert reader["subjects"] == [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}]
    (auth,) = find(docs, "RoleBinding")
    assert (auth["metadata"]["namespace"], auth["roleRef"]["name"]) == ("kube-system", "extension-apiserver-authentication-reader")
    assert auth["subjects"][0]["name"] == pod["serviceAccountName"]


@pytest.mark.parametrize("overrides,message", [
    ("worker: {autoscaling: {enabled: true}}", "set metricsApi.enabled=true"),
    ("worker: {autoscaling: {enabled: true, requestsInFlightPerReplica: null}}", "needs a signal"),
    ("triton: {autoscaling: {enabled: true}}", "serving_triton_pending_requests"),
    ("{metricsApi: {enabled: true}, triton: {modelLoading: controlPlane, autoscaling: {enabled: true}}}",
     "must be auto or pod"),
])
def test_an_hpa_without_a_signal_it_can_have_is_refused(overrides, message):
    with pytest.raises(Exception, match=message):
        manifests("default", overrides)


def helm_template(kube_version: str, *args: str) -> list[dict]:
    """`helm template --kube-version` with the real helm binary (scripts/kube-build.sh caches it): the
    library renderer above has no Kubernetes version to set, and the API versions the chart picks
    depend on it."""
    import subprocess

    from tests.support.ci import cannot_run
    from tests.support.kube import tools

    helm = tools.BIN / "helm"
    if not helm.exists():
        cannot_run(f"no helm binary at {helm}: run scripts/kube-build.sh (`make test` runs it)")
    out = subprocess.run([str(helm), "template", "demo", str(CHART), "-n", "ml", "--kube-version", kube_version,
                          *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize(("kube_version", "hpa", "pdb"), [
    ("1.20.2", "autoscaling/v2beta2", "policy/v1beta1"),  # installed for real: tests/deploy/kube
    ("1.22.0", "autoscaling/v2beta2", "policy/v1"),
    (KUBE_VERSION, "autoscaling/v2", "policy/v1"),
])
def test_the_autoscaler_and_disruption_budget_api_versions_follow_the_cluster(kube_version, hpa, pdb):
    docs = helm_template(kube_version, "-f", str(VALUES_FILES["autoscaling"]))
    assert [d["apiVersion"] for d in find(docs, "HorizontalPodAutoscaler")] == [hpa, hpa]  # workers, Triton
    assert [d["apiVersion"] for d in find(docs, "PodDisruptionBudget")] == [pdb]
    # the same objects whatever the version (their contents differ only by the tokens generated per render)
    names = lambda ds: sorted((d["kind"], d["metadata"]["name"]) for d in ds)  # noqa: E731
    assert names(docs) == names(helm_template(KUBE_VERSION, "-f", str(VALUES_FILES["autoscaling"])))


def test_the_chart_refuses_a_kubernetes_older_than_1_20():
    import subprocess

    from tests.support.kube import tools

    helm_template("1.20.0")  # the oldest accepted (cannot_run without the helm binary)
    out = subprocess.run([str(tools.BIN / "helm"), "template", "demo", str(CHART), "--kube-version", "1.19.9"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "kubeVersion" in out.stderr, out.stderr


def test_helm_test_pod_calls_the_workers_service():
    (pod,) = [d for d in find(manifests("default"), "Pod")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "http://demo-serving-worker:9090" in script and "/v2/health/ready" in script
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_external_database_values_drop_the_in_chart_postgresql_and_kafka():
    default, external = manifests("default"), manifests("external-db")
    assert {d["metadata"]["name"] for d in find(default, "StatefulSet")} == {"demo-serving-postgresql",
                                                                             "demo-serving-kafka"}
    assert not find(external, "StatefulSet")


def test_service_monitor_scrapes_the_statistics_job_the_alerts_use():
    assert "ServiceMonitor" not in {d["kind"] for d in manifests("default")}
    docs = manifests("autoscaling")  # enables metrics.serviceMonitor
    monitors = find(docs, "ServiceMonitor")
    assert len(monitors) == 2
    for sm in monitors:
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        services = [s for s in find(docs, "Service")
                    if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(services) == 1
        port_names = {p["name"] for p in services[0]["spec"]["ports"]}
        assert all(ep["port"] in port_names for ep in sm["spec"]["endpoints"])
    stats = [sm for sm in monitors if sm["metadata"]["name"].endswith("-statistics")][0]
    assert stats["spec"]["endpoints"][0]["relabelings"] == [{"targetLabel": "job", "replacement": "serving-statistics"}]


def test_serving_pods_run_as_non_root_with_a_read_only_root():
    for doc in find(manifests("default"), "Deployment"):
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            if c["name"] != "triton":
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_notes_tell_the_user_how_to_reach_the_control_plane():
    notes = rendered_files("default")["serving/templates/NOTES.txt"]
    assert "port-forward svc/demo-serving-control-plane 8080:8080" in notes
    assert "http://127.0.0.1:8080/console" in notes and "get secret demo-serving-tokens" in notes
    assert "serving model upload" in notes and "/serve/sentiment" in notes


def test_prometheus_rule_and_dashboards_are_the_shipped_files():
    import json

    from tests.deploy.artifacts import REPO

    assert not find(manifests("default"), "PrometheusRule")
    docs = manifests("autoscaling")  # enables metrics.prometheusRule and metrics.grafanaDashboards
    (rule,) = find(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    (dashboards,) = [cm for cm in find(docs, "ConfigMap") if cm["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {p.name: json.loads(p.read_text()) for p in (REPO / "grafana" / "dashboards").glob("*.json")}
    assert {k: json.loads(v) for k, v in dashboards["data"].items()} == shipped


@pytest.mark.parametrize("bad", [{"worker": {"replicaCount": 3}}, {"kafka": {"enabled": "yes"}},
                                 {"triton": {"gpu": {"count": 0}}}, {"postgresql": {"auth": {"pasword": "x"}}}])
def test_values_schema_rejects_misspelt_or_mistyped_values(bad):
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values("default"))  # the defaults pass
        with pytest.raises(helm.HelmValuesError):
            chart.render(bad, name="demo")


INGRESS_TLS = {"ingress": {"enabled": True, "className": "nginx", "hosts": ["models.example.com"],
                           "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
                           "tls": [{"secretName": "serving-tls", "hosts": ["models.example.com"]}]}}


def test_the_ingress_terminates_tls_with_the_named_secret_in_front_of_the_workers():
    import helm_python as helm
    import kubernetes_validate

    assert find(manifests("default"), "Ingress") == []  # off by default
    report = helm.lint(CHART, INGRESS_TLS, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report
    docs = manifests("default", yaml.safe_dump(INGRESS_TLS))
    (ingress,) = find(docs, "Ingress")
    kubernetes_validate.validate(ingress, KUBE_VERSION, strict=True)
    assert ingress["spec"]["tls"] == [{"secretName": "serving-tls", "hosts": ["models.example.com"]}]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "models.example.com"
    routed = {}  # path -> the component of the Service it goes to
    for path in rule["http"]["paths"]:
        (service,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == path["backend"]["service"]["name"]]
        assert path["backend"]["service"]["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
        assert path["pathType"] == "Prefix"
        routed[path["path"]] = service["metadata"]["labels"]["app.kubernetes.io/component"]
    assert routed == {"/": "worker", "/console": "control-plane"}  # the console, not the rest of the API
    notes = next(v for k, v in rendered_files("default", yaml.safe_dump(INGRESS_TLS)).items() if k.endswith("NOTES.txt"))
    assert "https://models.example.com/serve/sentiment" in notes and "https://models.example.com/console" in notes
    without = manifests("default", yaml.safe_dump({"ingress": {**INGRESS_TLS["ingress"], "console": False}}))
    (ingress,) = find(without, "Ingress")
    assert [p["path"] for p in ingress["spec"]["rules"][0]["http"]["paths"]] == ["/"]


def test_an_ingress_without_tls_is_refused_unless_plain_http_is_asked_for():
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="ingress.enabled needs ingress.tls"):
        rendered_files("default", yaml.safe_dump({"ingress": {"enabled": True}}))
    (ingress,) = find(manifests("default", yaml.safe_dump({"ingress": {"enabled": True, "plainHttp": True}})),
                      "Ingress")
    assert "tls" not in ingress["spec"] and "host" not in ingress["spec"]["rules"][0]
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.render({"ingress": {"enabled": True, "tls": [{"secretName": "serving-tls"}]}}, name="demo")


# --- several Triton pods (triton.replicas; docs/deploy-helm.md "Several Triton pods") ----------------------

def _triton(docs: list[dict]) -> tuple[dict, dict[str, dict]]:
    (dep,) = [d for d in find(docs, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == "triton"]
    return dep, {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _port(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


@pytest.mark.parametrize("mode", ["nvidia", "embedded"])
def test_triton_replicas_give_pods_that_load_their_own_models_behind_a_headless_service(mode):
    import helm_python as helm
    import kubernetes_validate

    from serving.settings import TritonSettings, TritonSidecarSettings
    from serving.worker.engines.triton_pool import addresses_source
    from tests.deploy.artifacts import env_names

    overrides = {"triton": {"replicas": 2, "mode": mode}, "metrics": {"serviceMonitor": {"enabled": True}}}
    report = helm.lint(CHART, overrides, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report
    docs = manifests("default", yaml.safe_dump(overrides))
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    dep, containers = _triton(docs)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # no shared repository volume, no pinning to the control plane's node
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v] and "affinity" not in pod
    # a terminating pod serves until the workers have looked the pods up again (their period: 5 s)
    assert containers["triton"]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pod["terminationGracePeriodSeconds"] == 45

    # the pod is Ready only once its loader says every deployed model is loaded
    loader = containers["triton" if mode == "embedded" else "model-loader"]
    assert loader["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "readiness"}
    assert int(_env(loader)["SERVING_TRITON_READINESS_PORT"]) == _port(loader, "readiness")
    settings = TritonSettings if mode == "embedded" else TritonSidecarSettings
    assert set(_env(loader)) <= env_names(settings), set(_env(loader)) - env_names(settings)
    if mode == "embedded":
        assert set(containers) == {"triton"} and loader["args"] == ["triton"]
        assert loader["image"] == "serving-triton:0.1.0"
        for port in ("http", "grpc", "metrics"):
            assert int(_env(loader)[f"SERVING_TRITON_{port.upper()}_PORT"]) == _port(loader, port)
    else:
        triton = containers["triton"]
        assert set(containers) == {"triton", "model-loader"} and loader["args"] == ["triton-sidecar"]
        args = dict(a.split("=", 1) for a in triton["args"])
        env = _env(loader)
        assert args["--model-repository"] == env["SERVING_TRITON_MODEL_REPOSITORY"]
        assert env["SERVING_TRITON_CONTROL_URL"] == f"http://127.0.0.1:{args['--http-port']}"
        assert args["--model-control-mode"] == "explicit"
        mounts = {c: {m["name"]: m["mountPath"] for m in containers[c]["volumeMounts"]} for c in containers}
        assert mounts["triton"]["home"] == mounts["model-loader"]["home"] == env["SERVING_HOME"]
        assert env["SERVING_TRITON_MODEL_REPOSITORY"].startswith(env["SERVING_HOME"] + "/")
        assert {"name": "home", "emptyDir": {}} in pod["volumes"]

    # workers resolve the headless Service: one address per ready Triton pod, on the gRPC port
    cms = {d["metadata"]["name"]: d["data"] for d in find(docs, "ConfigMap")}
    url = cms["demo-serving-worker"]["SERVING_TRITON_GRPC_URL"]
    source = addresses_source(url, lookup=lambda host, port: [f"10.0.0.1:{port}"])
    (headless,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == source.host]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (grpc,) = [p for p in headless["spec"]["ports"] if p["name"] == "grpc"]
    assert source.port == grpc["port"] == _port(containers["triton"], "grpc")
    # the control plane no longer loads through the Service (it still writes its repository volume)
    assert "SERVING_TRITON_CONTROL_URL" not in cms["demo-serving-control-plane"]
    # the Triton ServiceMonitor still selects exactly one Service (each pod scraped once)
    (sm,) = [m for m in find(docs, "ServiceMonitor") if m["metadata"]["name"].endswith("-triton")]
    assert len([s for s in find(docs, "Service")
                if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]) == 1


def test_one_triton_by_default_as_before():
    docs = manifests("default")
    dep, containers = _triton(docs)
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert set(containers) == {"triton"}
    assert containers["triton"]["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    # Recreate: the one pod goes before its replacement comes, so waiting before SIGTERM would gain nothing
    assert "lifecycle" not in containers["triton"] and "terminationGracePeriodSeconds" not in dep["spec"]["template"]["spec"]
    cms = {d["metadata"]["name"]: d["data"] for d in find(docs, "ConfigMap")}
    assert cms["demo-serving-worker"]["SERVING_TRITON_GRPC_URL"] == "demo-serving-triton:8001"
    assert cms["demo-serving-control-plane"]["SERVING_TRITON_CONTROL_URL"] == "http://demo-serving-triton:8000"
    # one NVIDIA Triton may still load its own models (no shared volume needed: e.g. a GPU node of its own)
    dep, containers = _triton(manifests("default", yaml.safe_dump({"triton": {"modelLoading": "pod"}})))
    assert dep["spec"]["replicas"] == 1 and set(containers) == {"triton", "model-loader"}


def test_triton_values_that_cannot_work_are_refused():
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="modelLoading=controlPlane needs triton.replicas=1"):
        rendered_files("default", yaml.safe_dump({"triton": {"replicas": 2, "modelLoading": "controlPlane"}}))
    with pytest.raises(helm.HelmError, match="embedded loads its own models"):
        rendered_files("default", yaml.safe_dump({"triton": {"mode": "embedded", "modelLoading": "controlPlane"}}))
    with helm.Chart.load(CHART) as chart:
        for bad in ({"triton": {"replicas": 0}}, {"triton": {"mode": "nvida"}}, {"triton": {"modelLoading": "pods"}},
                    {"triton": {"ports": {"readines": 8005}}}):
            with pytest.raises(helm.HelmValuesError):
                chart.render(bad, name="demo")


def test_a_terminating_workers_requests_get_the_grace_period_left_after_its_prestop_sleep():
    """SERVING_WORKER_GRACEFUL_STOP_S: the pod's grace period, less the preStop sleep, less 5 s to exit in;
    a request still running past it is cancelled (a 500), so it must not be cut at uvicorn's few seconds."""
    worker = next(d for d in find(manifests("default"), "Deployment") if d["metadata"]["name"].endswith("-worker"))
    pod = worker["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "worker"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    (sleep,) = [int(c) for c in container["lifecycle"]["preStop"]["exec"]["command"][1:]]  # ["sleep", "5"]
    assert float(env["SERVING_WORKER_GRACEFUL_STOP_S"]) == pod["terminationGracePeriodSeconds"] - sleep - 5 > 2


def test_workers_log_predictions_to_a_topic_of_the_release_when_the_chart_has_kafka():
    """docs/prediction-log.md: with Kafka the prediction log goes to ``<release>-predictions`` (or the topic
    named in the values); with no Kafka at all, to the workers' default rotating files."""
    def worker_config(overrides: str = "") -> dict:
        docs = manifests("default", overrides)
        return next(c["data"] for c in find(docs, "ConfigMap") if c["metadata"]["name"].endswith("-worker"))

    default = worker_config()
    assert (default["SERVING_PREDICTION_LOG_SINK"], default["SERVING_PREDICTION_LOG_TOPIC"]) == ("kafka", "demo-predictions")
    # feedback is joined by the statistics service over HTTP, with Kafka or without
    assert default["SERVING_STATISTICS_HOST"] == "demo-serving-statistics"
    assert worker_config("predictionLogTopic: team-a-predictions")["SERVING_PREDICTION_LOG_TOPIC"] == "team-a-predictions"
    none = worker_config("kafka: {enabled: false}")
    assert "SERVING_KAFKA_BOOTSTRAP_SERVERS" not in none and "SERVING_PREDICTION_LOG_SINK" not in none
    assert none["SERVING_STATISTICS_HOST"] == "demo-serving-statistics"


def test_llm_engines_values_give_the_control_plane_a_launcher_allowed_to_make_engines():
    """llmEngines.enabled: the control plane's pod runs `serving llm` on Kubernetes with the engine template
    (checked by the launcher's own model), allowed to manage Deployments and Services of its namespace and read
    Pods (nothing else); the workers read where engines are from it, through the control plane's Service."""
    from serving.llm.kube.template import EngineTemplate

    assert not find(manifests("default"), "Role")
    docs = manifests("llm-engines")
    (cp,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    pod = cp["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (launcher,) = [c for c in pod["containers"] if c["name"] == "llm-launcher"]
    assert launcher["args"] == ["llm"]
    env = {e["name"]: e.get("value") for e in launcher["env"]}
    assert env["SERVING_LLM_ON_KUBERNETES"] == "true"
    template = EngineTemplate.model_validate_json(env["SERVING_LLM_KUBE_ENGINE"])
    assert template.release == f"{RELEASE}-serving" and template.gpus == 1
    assert template.image.startswith("vllm/vllm-openai:v") and template.extra_args == ["--enable-prefix-caching"]
    assert template.node_selector == {"nvidia.com/gpu.present": "true"}
    assert template.init_image == cp["spec"]["template"]["spec"]["containers"][0]["image"]
    assert template.control_plane_url == f"http://{RELEASE}-serving-control-plane:8080"
    # each engine's HPA on its own signals, from the metrics API this release serves
    assert template.autoscaling is not None and template.autoscaling.api_version == "autoscaling/v2"
    assert template.autoscaling.targets() == [("serving_llm_waiting_requests", "AverageValue", 4),
                                              ("serving_llm_ttft_ms", "Value", 800)]
    cp_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert cp_env["SERVING_AUTOSCALING_LLM_ENGINES_PORT"] == str(template.port)
    (role,) = find(docs, "Role", f"{RELEASE}-serving-llm-engines")
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert set(rules) == {("apps", "deployments"), ("", "services"), ("", "pods"), ("autoscaling", "horizontalpodautoscalers")}
    assert "delete" in rules[("apps", "deployments")] and rules[("", "pods")] <= {"get", "list", "watch"}
    (binding,) = find(docs, "RoleBinding", f"{RELEASE}-serving-llm-engines")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    (worker_cm,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"] == f"{RELEASE}-serving-worker"]
    url = worker_cm["data"]["SERVING_LLM_LAUNCHER_URL"]
    (svc,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "llm-engines"]
    assert url == f"http://{RELEASE}-serving-control-plane:{port['port']}"
    assert port["targetPort"] == "llm-engines" and launcher["ports"][0]["name"] == "llm-engines"
    assert int(env["SERVING_LLM_LAUNCHER_PORT"]) == launcher["ports"][0]["containerPort"]


def test_keda_values_render_scaled_objects_on_the_same_signals_in_place_of_the_hpas():
    """Where KEDA runs: a ScaledObject per autoscaled component (no HPA: KEDA makes its own), one metrics-api
    trigger per signal of the HPA it replaces, reading the control plane's signals port with the worker token
    (a TriggerAuthentication on the tokens Secret), CPU as KEDA's cpu trigger. Checked against KEDA's CRD
    fields (tests/deploy/keda_schema.py); KEDA itself is not installed on the test cluster."""
    import jsonschema

    from tests.deploy.keda_schema import METRICS_API_KEYS, SCALED_OBJECT, TRIGGER_AUTHENTICATION

    docs = manifests("keda")
    assert not find(docs, "HorizontalPodAutoscaler") and not find(docs, "APIService")
    scaled = {d["metadata"]["name"]: d for d in find(docs, "ScaledObject")}
    assert set(scaled) == {f"{RELEASE}-serving-{c}" for c in ("worker", "triton", "llm")}
    for doc in scaled.values():
        jsonschema.validate(doc, SCALED_OBJECT)
        assert find(docs, "Deployment", doc["spec"]["scaleTargetRef"]["name"])
    (auth,) = find(docs, "TriggerAuthentication")
    jsonschema.validate(auth, TRIGGER_AUTHENTICATION)
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "token", "name": f"{RELEASE}-serving-tokens",
                                                "key": "worker-token"}]
    worker = scaled[f"{RELEASE}-serving-worker"]
    api, cpu = worker["spec"]["triggers"]
    assert api["type"] == "metrics-api" and set(api["metadata"]) <= METRICS_API_KEYS
    assert api["metadata"] == {"url": f"http://{RELEASE}-serving-control-plane:8090/signals/serving_worker_requests_in_flight",
                               "valueLocation": "value", "targetValue": "4", "authMode": "bearer"}
    assert (api["metricType"], api["authenticationRef"]) == ("AverageValue", {"name": auth["metadata"]["name"]})
    assert cpu == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}
    assert worker["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == \
        {"scaleDown": {"stabilizationWindowSeconds": 120}}
    llm = [(t["metadata"]["url"].rsplit("/", 1)[1], t["metricType"], t["metadata"]["targetValue"])
           for t in scaled[f"{RELEASE}-serving-llm"]["spec"]["triggers"]]
    assert llm == [("serving_llm_waiting_requests", "AverageValue", "4"), ("serving_llm_ttft_ms", "Value", "800")]
    # the control plane serves those URLs: its signals port, through its Service, and samples the pods
    (cp,) = find(docs, "Deployment", f"{RELEASE}-serving-control-plane")
    env = {e["name"]: e.get("value") for e in cp["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SERVING_SIGNALS_PORT"] == "8090" and "SERVING_METRICS_API_PORT" not in env
    assert env["SERVING_AUTOSCALING_WORKERS"] == f"{RELEASE}-serving-worker-pods:9090"
    (svc,) = find(docs, "Service", f"{RELEASE}-serving-control-plane")
    assert {"name": "signals", "port": 8090, "targetPort": "signals", "protocol": "TCP"} in svc["spec"]["ports"]
    assert find(docs, "Service", f"{RELEASE}-serving-worker-pods")


def test_keda_and_the_metrics_api_together_are_refused():
    with pytest.raises(Exception, match="one APIService"):
        manifests("keda", "metricsApi: {enabled: true}")


def test_two_control_planes_on_postgresql_roll_one_at_a_time_keep_one_in_a_disruption_and_only_the_leader_acts():
    """controlPlane.replicas=2 (docs/high-availability.md): rolling, one PodDisruptionBudget keeping one, the
    Service keeping a browser on the replica its console session lives in, the launcher asking its own control
    plane whether it leads; one control plane stays Recreate as before; SQLite with two refuses to render."""
    import helm_python as helm
    import kubernetes_validate

    overrides = {"controlPlane": {"replicas": 2}, "llmEngines": {"enabled": True}}
    docs = manifests("default", yaml.safe_dump(overrides))
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    (dep,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    (svc,) = [s for s in find(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    assert "sessionAffinity" not in svc["spec"]  # console sessions are in the database: any replica answers
    (pdb,) = [p for p in find(docs, "PodDisruptionBudget") if p["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    launcher = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "llm-launcher")
    port = dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert {"name": "SERVING_LLM_LEADER_URL", "value": f"http://127.0.0.1:{port}/leadership"} in launcher["env"]
    main = dep["spec"]["template"]["spec"]["containers"][0]
    assert main["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]

    one = manifests("default")
    (dep,) = [d for d in find(one, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-serving-control-plane"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert not [p for p in find(one, "PodDisruptionBudget") if "control-plane" in p["metadata"]["name"]]
    with pytest.raises(helm.HelmError, match="controlPlane.replicas > 1 needs PostgreSQL"):
        rendered_files("default", yaml.safe_dump({"controlPlane": {"replicas": 2}, "postgresql": {"enabled": False}}))
