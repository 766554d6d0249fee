"""helm/serving installed for real, with `helm install --wait`, on a Kubernetes v1.20.2 node (tests/support/kube).

1. The platform images are built as the compose test builds them (scripts/images.sh, podman) and
   copied into the node's containerd; there is no registry. PostgreSQL and Kafka run from the
   chart's own StatefulSets with the compose test's stand-in images (Debian's PostgreSQL 15 keeping
   the postgres image's uid 70 and start-up contract; Tansu for Kafka), and Triton is the platform
   image's embedded Triton (``triton.mode: embedded``), as in deploy/docker-compose.stand-ins.yml: NVIDIA's
   image cannot be pulled here. Claims are bound to ``local`` volumes (tests/support/kube/storage.py).
2. Every pod becomes Ready; `helm test` runs the chart's test pod, which calls a worker.
3. The user flow through the cluster's Services, reached from the host through the CNI bridge:
   `serving --control-plane http://<ClusterIP>:8080 model upload / model add / key create`, answers
   over HTTP and gRPC equal to onnxruntime's on the same input, a 10% canary whose share stays
   within a binomial bound, and the requests counted on the statistics Service's /metrics; the web
   console at the control plane's Service, in Chromium (tests/deploy/console_check.py).
4. The API server accepts the chart's HorizontalPodAutoscaler and PodDisruptionBudget as rendered for
   1.20 (autoscaling/v2beta2, policy/v1beta1), server-side dry run.
5. `helm uninstall` leaves only what docs/deploy-helm.md says it leaves.
"""
from __future__ import annotations

import json
import re
import subprocess

import httpx
import numpy as np
import pytest
import yaml

from tests.deploy.artifacts import CHART
from tests.deploy.console_check import check_console
from tests.deploy.kube.helm_release import NS, RELEASE, deploy_clf, installed
from tests.deploy.reference import TEXT, encode, reference_logits
from tests.support.kube import tools
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(2400)  # the first build of the images: 5-25 min here

COMPONENTS = {"control-plane", "worker", "statistics", "triton", "postgresql", "kafka"}
CANARY_REQUESTS = 300


@pytest.fixture(scope="module")
def release(kube_cluster, platform_images_in_node, tmp_path_factory):
    with installed(kube_cluster, platform_images_in_node, tmp_path_factory.mktemp("helm")) as rel:
        yield rel


def test_every_pod_is_ready_with_the_stand_in_images(release, platform_images_in_node):
    pods = release.cluster.get("pods", "-n", NS)["items"]
    by_component: dict[str, list[dict]] = {}
    for pod in pods:
        by_component.setdefault(pod["metadata"]["labels"]["app.kubernetes.io/component"], []).append(pod)
    assert set(by_component) == COMPONENTS, sorted(by_component)
    assert len(by_component["worker"]) == 2
    for pod in pods:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready.get("Ready") == "True", (pod["metadata"]["name"], pod["status"])
    image = lambda c: by_component[c][0]["spec"]["containers"][0]["image"]  # noqa: E731
    # the compose test's stand-ins, run by the chart's own StatefulSets
    assert image("postgresql") == platform_images_in_node["SERVING_STANDIN_POSTGRES_IMAGE"]
    assert image("kafka") == platform_images_in_node["SERVING_STANDIN_KAFKA_IMAGE"]
    assert image("triton") == platform_images_in_node["SERVING_TRITON_IMAGE"]
    claims = release.cluster.get("pvc", "-n", NS)["items"]
    assert claims and all(c["status"]["phase"] == "Bound" for c in claims), [c["status"] for c in claims]


def test_helm_test_calls_a_worker(release):
    out = release.helm("test", RELEASE, "--timeout", "3m", timeout=240)
    assert re.search(r"TEST SUITE:\s+\S+-test-worker", out.stdout), out.stdout
    assert "Phase:          Succeeded" in out.stdout or re.search(r"Phase:\s+Succeeded", out.stdout), out.stdout


def test_a_model_deployed_with_the_cli_answers_as_onnxruntime_over_http_and_grpc(release, tiny_model):
    deploy_clf(release, tiny_model)
    expected = reference_logits(tiny_model, [TEXT])
    with release.worker() as client:
        r = client.post("/serve/clf", json={"text": TEXT})
        assert r.status_code == 200, r.text
        assert r.headers["X-Model-Version"] == "1"
        np.testing.assert_allclose(r.json()["logits"], expected[0], atol=1e-4)
        assert client.post("/serve/clf", json={"text": TEXT}, headers={"Authorization": ""}).status_code == 401

    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array in encode(tiny_model, [TEXT]).items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(release.service_url("worker", 9091).removeprefix("http://"))
    try:
        result = client.infer("clf", inputs, outputs=[grpcclient.InferRequestedOutput("logits")],
                              headers={"authorization": f"Bearer {release.client_key}"})
        np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-4)
        assert result.get_response().model_version == "1"
    finally:
        client.close()


def test_a_ten_percent_canary_gets_its_share_and_statistics_count_the_requests(release, tiny_model):
    if not release.client_key:
        pytest.fail("needs the model deployed by the previous test", pytrace=False)
    release.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))  # clf:2
    release.cli("model", "add", "--endpoint", "clf", "--model", "clf:2", "--tokenizer", str(tiny_model.tokenizer_dir),
                "--labels", ",".join(tiny_model.labels), "--canary", "10%")

    def version(client: httpx.Client) -> str:
        r = client.post("/serve/clf", json={"text": TEXT})
        assert r.status_code == 200, r.text
        return r.headers["X-Model-Version"]

    # Until a worker has version 2 ready its share goes to version 1 (serving/worker/dataplane.py): every
    # worker pod, asked directly at its pod IP, has it ready before the count starts.
    pods = release.cluster.get("pods", "-n", NS, "-l", "app.kubernetes.io/component=worker")["items"]
    for pod in pods:
        url = f"http://{pod['status']['podIP']}:9090/v2/models/clf/versions/2/ready"
        wait_until(lambda: httpx.get(url, headers={"Authorization": f"Bearer {release.client_key}"},
                                     timeout=10).status_code == 200,
                   180, f"version 2 ready on {pod['metadata']['name']}", interval=1, on_timeout=release.describe)
    with release.worker() as client:
        counts = {"1": 0, "2": 0}
        for _ in range(CANARY_REQUESTS):
            counts[version(client)] += 1
    print(f"\ncanary split over {CANARY_REQUESTS} requests: {counts}")
    # Binomial(300, 0.10): mean 30, sd 5.2; +-4.5 sd (a false failure about once in 150,000 runs)
    assert 7 <= counts["2"] <= 53, counts

    stats = release.service_url("statistics", 9999)

    def counted() -> float:
        text = httpx.get(f"{stats}/metrics", timeout=10).text
        return sum(float(v) for v in re.findall(
            r'^serving_requests_total\{[^}]*endpoint="clf"[^}]*status="200"[^}]*\} (\S+)$', text, re.M))
    # worker -> Kafka (stand-in) -> statistics service
    wait_until(lambda: counted() >= CANARY_REQUESTS, 120, f"{CANARY_REQUESTS}+ requests on /metrics", interval=2,
               on_timeout=release.describe)


def test_predictions_go_to_the_releases_topic_and_export_from_a_worker_pod(release):
    """docs/prediction-log.md on the cluster: with the chart's Kafka the workers log to ``<release>-predictions``;
    `serving log export`, run in a worker pod as a user would (kubectl exec), reads it back."""
    if not release.client_key:
        pytest.fail("needs the model deployed by an earlier test", pytrace=False)
    release.cli("endpoint", "log", "--endpoint", "clf", "--sample", "100%")
    pod = release.cluster.get("pods", "-n", NS, "-l", "app.kubernetes.io/component=worker")["items"][0]["metadata"]["name"]
    ids = [f"kube-log-{i}" for i in range(5)]

    def exported() -> set[str]:
        release.cluster.kubectl("exec", "-n", NS, pod, "--", "serving", "log", "export", "--endpoint", "clf",
                                "--format", "jsonl", "--out", "/tmp/clf.jsonl")
        out = release.cluster.kubectl("exec", "-n", NS, pod, "--", "cat", "/tmp/clf.jsonl").stdout
        return {json.loads(line)["request_id"] for line in out.splitlines()}

    def logged() -> bool:  # until the workers have the new setting: requests sent now are in the topic
        with release.worker() as client:
            for request_id in ids:
                r = client.post("/serve/clf", json={"text": TEXT}, headers={"X-Request-Id": request_id})
                assert r.status_code == 200, r.text
        return set(ids) <= exported()
    wait_until(logged, 180, f"the requests in the {RELEASE}-predictions topic", interval=3, on_timeout=release.describe)


def test_the_console_through_the_control_planes_service(release):
    """/console at the control plane's Service (as `kubectl port-forward svc/...-control-plane` or the
    Ingress reach it), in Chromium: sign-in, the endpoint with the versions the API has, the playground's
    answer through the workers' Service with the key, a CLI change on the open page by its event stream
    (tests/deploy/console_check.py)."""
    if not release.client_key:
        pytest.fail("needs the model deployed by the previous tests", pytrace=False)
    listed = json.loads(release.cli("endpoint", "list", "--json").stdout)
    versions = {t["version"] for ep in listed if ep["name"] == "clf" for t in ep["targets"]}

    def direct(version: str, text: str) -> dict:
        with release.worker() as client:
            r = client.post(f"/serve/clf/{version}", json={"text": text})
        assert r.status_code == 200 and r.headers["X-Model-Version"] == version, r.text
        return r.json()

    cookie = check_console(f"{release.service_url('control-plane', 8080)}/console", release.admin_token, "clf",
                           versions, release.client_key, direct,
                           change=lambda: release.cli("metrics", "add", "--endpoint", "clf", "--log-freq", "1"),
                           shows="PUT /endpoints/{name}/log-freq")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"], cookie  # plain HTTP


def test_the_api_server_accepts_the_1_20_autoscaler_and_disruption_budget(release):
    """Rendered for this cluster's API versions (`helm template --kube-version` of the cluster), created
    server-side as a dry run: the API server validates them as an install would."""
    version = json.loads(release.cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    out = subprocess.run([tools.exe("helm"), "template", RELEASE, str(CHART), "-n", NS, "--kube-version", version,
                          "-f", str(CHART / "ci" / "autoscaling-values.yaml"),
                          "--set", "metrics.serviceMonitor.enabled=false,metrics.prometheusRule.enabled=false",
                          "--show-only", "templates/worker.yaml"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"]: d["apiVersion"] for d in docs}
    assert kinds["HorizontalPodAutoscaler"] == "autoscaling/v2beta2"
    assert kinds["PodDisruptionBudget"] == "policy/v1beta1"
    hpa_pdb = "\n---\n".join(yaml.safe_dump(d) for d in docs if d["kind"] in ("HorizontalPodAutoscaler",
                                                                              "PodDisruptionBudget"))
    created = release.cluster.kubectl("create", "--dry-run=server", "-n", NS, "-f", "-", input=hpa_pdb)
    assert "horizontalpodautoscaler.autoscaling/demo-serving-worker created (server dry run)" in created.stdout
    assert "poddisruptionbudget.policy/demo-serving-worker created (server dry run)" in created.stdout


def test_uninstall_leaves_only_the_statefulsets_claims(release):
    release.helm("uninstall", RELEASE, "--wait", timeout=300) if "--wait" in release.helm(
        "uninstall", "--help").stdout else release.helm("uninstall", RELEASE, timeout=300)

    def remaining() -> dict[str, list[str]]:
        found = {}
        for kind in ("deployments", "statefulsets", "services", "configmaps", "secrets", "pods", "pvc",
                     "serviceaccounts"):
            names = [i["metadata"]["name"] for i in release.cluster.get(kind, "-n", NS)["items"]]
            # what Kubernetes itself keeps in every namespace
            names = [n for n in names if n != "default" and not n.startswith("default-token-")
                     and n != "kube-root-ca.crt"]
            if names:
                found[kind] = sorted(names)
        return found
    expected = {"pvc": [f"data-{RELEASE}-serving-kafka-0", f"data-{RELEASE}-serving-postgresql-0"]}
    wait_until(lambda: remaining() == expected, 120, "only the StatefulSets' claims left",
               interval=1, on_timeout=lambda: str(remaining()))
    # the command docs/deploy-helm.md gives to drop them finds them by the release's label
    labelled = release.cluster.get("pvc", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert sorted(c["metadata"]["name"] for c in labelled) == expected["pvc"]
