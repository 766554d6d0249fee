"""deploy/docker-compose.yml, run for real: images built, `compose up`, a model served through it.

Where a container engine can run (podman here; Docker works the same way, see tests/deploy/engine.py):

1. ``scripts/images.sh`` builds the images with no registry: a Debian base (debootstrap, cached),
   the project's image from the Dockerfile, and stand-ins for the public images that cannot be
   pulled (deploy/docker-compose.stand-ins.yml says which and why: Triton -> the project's image
   running the embedded Triton, Postgres/Prometheus/nginx -> Debian's packages, Kafka -> Tansu;
   Grafana is not started).
2. ``deploy/init-env.sh`` (a copy, in a temporary directory) writes the settings and secrets and
   makes the gateway's self-signed certificate with its CA; ``compose up`` of the shipped compose
   file plus that override, with those settings, on free loopback ports, under a project name of
   its own; every service with a healthcheck must become healthy.
3. The gateway answers HTTPS only: a client trusting the generated CA (and nothing else) is
   served, plain HTTP on its port is refused, the default trust store refuses the certificate.
4. A small BERT classifier is uploaded and deployed with the `serving` CLI against the composed
   control plane, a client key for its endpoint is created with `serving key create`, and the
   model is called over HTTPS through the gateway and the composed workers with that key
   (401 without it; the answer compared with onnxruntime run here on the same input); the
   requests are counted in the composed Prometheus (PromQL over its HTTP API). The web console
   answers at /console through the same gateway, in Chromium (tests/deploy/console_check.py).
5. A second control plane (``--profile ha``: control-plane-2, docs/deploy-compose.md) joins; one of
   the two leads. A rollout of the model's next version is started; after its first step the leader
   is stopped: the other leads, resumes the rollout and promotes it, with every request through the
   gateway answered meanwhile. The first control plane is started again and the second removed.
6. ``compose down`` and ``up`` again on the same volumes: the registry and endpoints are still
   there and the model answers again. Containers, volumes and networks are removed at the end.

Skipped, with the reason, where no engine can run containers (tests/deploy/engine.py:why_not).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.deploy import platform_images
from tests.deploy.artifacts import DEPLOY, REPO
from tests.deploy.compose_env import read_env_file
from tests.deploy.console_check import check_console
from tests.deploy.engine import Engine, must_run, why_not
from tests.deploy.platform_images import image_names
from tests.deploy.reference import TEXT, encode, reference_logits
from tests.support.background import Background
from tests.support.browser import spki_hash
from tests.support.procs import free_port

FILES = ["docker-compose.yml", "docker-compose.stand-ins.yml"]
HEALTHY_SERVICES = {"postgres", "kafka", "control-plane", "triton", "statistics", "worker"}
RUNNING_SERVICES = HEALTHY_SERVICES | {"gateway", "prometheus"}

pytestmark = pytest.mark.timeout(2400)  # the first test builds the images: 5-25 min here

# Where no engine can run containers: in CI (CI=true) or with SERVING_TEST_COMPOSE=1 each test
# fails with the reason (a fresh machine missing a package must not pass quietly); elsewhere the
# tests are skipped with it. tests/test_ci_rule.py runs this module both ways with no engine.
_why = why_not()
if _why is not None and must_run():
    @pytest.fixture(scope="session", autouse=True)  # first: before session fixtures such as tiny_model
    def _compose_must_run():
        pytest.fail(f"compose stack cannot run here, and {must_run()} requires it: {_why}", pytrace=False)
elif _why is not None:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"compose stack not run: {_why}")]


def wait_until(predicate, timeout: float, what: str, interval: float = 1.0, on_timeout=lambda: ""):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})\n{on_timeout()}")


class ComposeStack:
    """One compose project of the shipped file plus the stand-ins override."""

    def __init__(self, engine: Engine, workdir: Path, images: dict[str, str]) -> None:
        self.engine = engine
        self.project = f"serving-test-{uuid.uuid4().hex[:8]}"
        self.ports = {name: free_port() for name in
                      ("CONTROL_PLANE_PORT", "CONTROL_PLANE_2_PORT", "WORKER_GATEWAY_PORT", "WORKER_GATEWAY_GRPC_PORT",
                       "WORKER_GATEWAY_HTTP_PORT", "STATISTICS_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT",
                       "TRITON_HTTP_PORT", "TORCHSERVE_MANAGEMENT_PORT")}
        # deploy/init-env.sh as a user runs it, in a copy: the template plus fresh secrets, and the
        # gateway's certificate (tls/server.crt, server.key) with the CA that clients trust.
        # Its settings go in the environment, which Compose prefers to deploy/.env: a
        # developer's .env and deploy/tls/ are not used.
        for name in ("init-env.sh", ".env.example"):
            shutil.copy(DEPLOY / name, workdir / name)
        subprocess.run(["sh", str(workdir / "init-env.sh")], check=True, capture_output=True, timeout=60)
        self.ca = workdir / "tls" / "ca.crt"
        self.settings = {**read_env_file(workdir / ".env"), **images,
                         **{k: str(p) for k, p in self.ports.items()},
                         # the gateway is the one port published beyond the host: loopback here
                         "WORKER_GATEWAY_PORT": f"127.0.0.1:{self.ports['WORKER_GATEWAY_PORT']}",
                         "WORKER_GATEWAY_GRPC_PORT": f"127.0.0.1:{self.ports['WORKER_GATEWAY_GRPC_PORT']}",
                         "WORKER_GATEWAY_HTTP_PORT": f"127.0.0.1:{self.ports['WORKER_GATEWAY_HTTP_PORT']}",
                         "GATEWAY_TLS_CERT": str(workdir / "tls" / "server.crt"),
                         "GATEWAY_TLS_KEY": str(workdir / "tls" / "server.key")}
        self.env = {**engine.env, **self.settings}
        self.client_key: str | None = None
        self.times: dict[str, float] = {}

    def url(self, port_name: str) -> str:
        return f"http://127.0.0.1:{self.ports[port_name]}"

    def gateway(self, with_key: bool = True, plain_http: bool = False) -> httpx.Client:
        """A client of the gateway: HTTPS trusting the generated CA and nothing else (or plain
        HTTP to gateway-http), sending the stack's client key unless told not to."""
        headers = {"Authorization": f"Bearer {self.client_key}"} if with_key and self.client_key else {}
        if plain_http:
            return httpx.Client(base_url=self.url("WORKER_GATEWAY_HTTP_PORT"), headers=headers, timeout=30)
        return httpx.Client(base_url=f"https://127.0.0.1:{self.ports['WORKER_GATEWAY_PORT']}", headers=headers,
                            verify=ssl.create_default_context(cafile=str(self.ca)), timeout=30)

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        cmd = [*self.engine.compose_cmd, "-p", self.project, *(a for f in FILES for a in ("-f", f)), *args]
        out = subprocess.run(cmd, cwd=DEPLOY, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    def up(self) -> None:
        self.compose("up", "-d")
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 300) -> None:
        def all_healthy() -> bool:
            by_service = self.engine.service_containers(self.project)
            if not RUNNING_SERVICES <= set(by_service):
                return False
            return all(self.engine.health(by_service[s]) == "healthy" for s in HEALTHY_SERVICES)

        wait_until(all_healthy, timeout, "every service running and healthy", interval=2,
                   on_timeout=lambda: self.engine.logs(self.project))

    def cli(self, *args: str, port: str = "CONTROL_PLANE_PORT") -> subprocess.CompletedProcess:
        """The `serving` CLI of this checkout, against the composed control plane (``port``: the
        setting of the one to ask, CONTROL_PLANE_2_PORT for control-plane-2)."""
        cmd = [sys.executable, "-m", "serving.cli.main", "--control-plane", self.url(port), *args]
        env = {**os.environ, "SERVING_TOKEN": self.settings["SERVING_ADMIN_TOKEN"]}
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"serving {' '.join(args)}: {out.stdout}\n{out.stderr}"
        return out

    def promql(self, query: str) -> list[dict]:
        r = httpx.get(f"{self.url('PROMETHEUS_PORT')}/api/v1/query", params={"query": query}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]


@pytest.fixture(scope="module")
def engine():
    eng = Engine.start()
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def images(engine):
    """scripts/images.sh, under tags of this run's own (the engine's images are shared: a build
    from another checkout tagging serving:latest meanwhile once swapped the image under this
    test); the layer cache is shared all the same, and the base image comes from its cache.
    ``SERVING_TEST_BUILD=0`` uses the images already built as :latest (e.g. from another checkout).
    Yields (the image settings for compose, seconds the build took); the tags are removed after."""
    if os.environ.get("SERVING_TEST_BUILD") == "0":
        yield image_names("latest"), 0.0
        return
    tag = f"test-{uuid.uuid4().hex[:8]}"
    try:
        yield platform_images.build(tag, engine.env)
    finally:
        platform_images.untag(image_names(tag), engine.env)


@pytest.fixture(scope="module")
def stack(engine, images, tmp_path_factory):
    names, build_s = images
    s = ComposeStack(engine, tmp_path_factory.mktemp("compose"), names)
    s.times["images"] = build_s
    try:
        start = time.monotonic()
        s.up()
        s.times["first up"] = time.monotonic() - start
        yield s
    finally:
        try:
            subprocess.run([*engine.compose_cmd, "-p", s.project, *(a for f in FILES for a in ("-f", f)),
                            "down", "-v"], cwd=DEPLOY, env=s.env, capture_output=True, timeout=300)
        finally:
            engine.remove_project(s.project)
        print("\ncompose test timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in s.times.items()))


def endpoint_answers(stack: ComposeStack, plain_http: bool = False) -> dict:
    """POST /serve/clf with the client key, over HTTPS through the gateway (nginx -> a composed
    worker -> composed Triton), or through gateway-http."""
    with stack.gateway(plain_http=plain_http) as client:
        r = client.post("/serve/clf", json={"text": TEXT})
    assert r.status_code == 200, r.text
    return {"version": r.headers["X-Model-Version"], **r.json()}


def wait_ready(stack: ComposeStack, what: str, plain_http: bool = False) -> None:
    def ready() -> bool:
        with stack.gateway(plain_http=plain_http) as client:
            return client.get("/v2/models/clf/ready").status_code == 200

    wait_until(ready, 120, what, on_timeout=lambda: stack.engine.logs(stack.project))


def test_every_service_is_up_and_healthy(stack, engine):
    by_service = engine.service_containers(stack.project)
    assert RUNNING_SERVICES <= set(by_service), sorted(by_service)
    assert "grafana" not in by_service  # no image for it here (see the override)
    assert "gateway-http" not in by_service  # plain HTTP only when asked for
    assert httpx.get(f"{stack.url('CONTROL_PLANE_PORT')}/health", timeout=5).json()["status"] == "ok"
    # the image's HEALTHCHECK survived the build (podman builds in docker format for it)
    worker = by_service["worker"]
    assert worker.attrs["Config"]["Healthcheck"]["Test"][-1] == "serving-healthcheck"
    assert worker.attrs["Config"]["User"] == "10001:10001"


def test_the_gateway_speaks_https_only_with_the_generated_certificate(stack):
    with stack.gateway(with_key=False) as client:
        r = client.get("/v2/health/live")
        assert r.status_code in (200, 401), r.text  # served over TLS (a key may be asked for)
        tls = r.extensions["network_stream"].get_extra_info("ssl_object")
        assert tls.version() in {"TLSv1.2", "TLSv1.3"}, tls.version()
    port = stack.ports["WORKER_GATEWAY_PORT"]
    plain = httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=10)
    assert plain.status_code == 400 and "plain HTTP request was sent to HTTPS port" in plain.text
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://127.0.0.1:{port}/v2/health/live", timeout=10)  # the default trust store
    with pytest.raises(httpx.ConnectError):  # nothing listens for plain HTTP unless asked
        httpx.get(f"{stack.url('WORKER_GATEWAY_HTTP_PORT')}/v2/health/live", timeout=10)


def test_a_model_deployed_with_the_cli_answers_over_https_with_a_client_key(stack, tiny_model):
    stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
    stack.cli("model", "add", "--endpoint", "clf", "--model", "clf:1", "--tokenizer", str(tiny_model.tokenizer_dir),
              "--labels", ",".join(tiny_model.labels))
    created = stack.cli("key", "create", "--name", "compose-test", "--endpoints", "clf").stdout
    (stack.client_key,) = re.findall(r"\bsk_[0-9a-f]{64}\b", created)
    wait_ready(stack, "clf ready behind the gateway, with the key")
    got = endpoint_answers(stack)
    expected = reference_logits(tiny_model, [TEXT])[0]
    assert got["version"] == "1"
    np.testing.assert_allclose(got["logits"], expected, atol=1e-4)
    assert got["label"] == tiny_model.labels[int(np.argmax(expected))]
    with stack.gateway(with_key=False) as client:
        for refused in (client.post("/serve/clf", json={"text": TEXT}), client.get("/v2/models/clf")):
            assert refused.status_code == 401, refused.text
    with stack.gateway(with_key=False) as client:
        wrong = client.post("/serve/clf", json={"text": TEXT}, headers={"Authorization": "Bearer sk_" + "0" * 64})
    assert wrong.status_code == 401, wrong.text


def test_the_console_through_the_gateway_over_https(stack):
    """/console through the gateway (nginx -> the composed control plane) in Chromium trusting the stack's
    own certificate and nothing else: sign-in, the endpoint, the playground's answer through the composed
    workers with the key, a CLI change on the open page by its event stream (tests/deploy/console_check.py);
    the session cookie is Secure behind HTTPS."""
    if not stack.client_key:
        pytest.fail("needs the model deployed by the previous test", pytrace=False)
    listed = json.loads(stack.cli("endpoint", "list", "--json").stdout)
    versions = {t["version"] for ep in listed if ep["name"] == "clf" for t in ep["targets"]}

    def direct(version: str, text: str) -> dict:
        with stack.gateway() as client:
            r = client.post(f"/serve/clf/{version}", json={"text": text})
        assert r.status_code == 200 and r.headers["X-Model-Version"] == version, r.text
        return r.json()

    cookie = check_console(
        f"https://127.0.0.1:{stack.ports['WORKER_GATEWAY_PORT']}/console", stack.settings["SERVING_ADMIN_TOKEN"],
        "clf", versions, stack.client_key, direct,
        change=lambda: stack.cli("metrics", "add", "--endpoint", "clf", "--log-freq", "1"),
        shows="PUT /endpoints/{name}/log-freq",
        trust_spki=(spki_hash((stack.ca.parent / "server.crt").read_bytes()),))
    assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie


def test_the_model_answers_over_grpc_with_tls_through_the_gateway(stack, tiny_model):
    """tritonclient.grpc with ssl=True, trusting the generated CA: the gateway's HTTP/2 server
    carries the v2 protocol to the workers' gRPC port; the key travels as gRPC metadata."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = []
    for name, array in encode(tiny_model, [TEXT]).items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.ports['WORKER_GATEWAY_GRPC_PORT']}", ssl=True,
                                              root_certificates=str(stack.ca))
    try:
        result = client.infer("clf", inputs, outputs=[grpcclient.InferRequestedOutput("logits")],
                              headers={"authorization": f"Bearer {stack.client_key}"})
        np.testing.assert_allclose(result.as_numpy("logits"), reference_logits(tiny_model, [TEXT]), atol=1e-4)
        assert result.get_response().model_version == "1"
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.infer("clf", inputs)
    finally:
        client.close()


def test_the_requests_are_counted_in_the_composed_prometheus(stack):
    with stack.gateway() as client:
        for _ in range(4):
            r = client.post("/serve/clf", json={"text": TEXT})
            assert r.status_code == 200, r.text
    query = 'sum(serving_requests_total{endpoint="clf",status="200"})'
    # worker -> Kafka (Tansu) -> statistics service -> scraped every 15 s by Prometheus
    result = wait_until(lambda: [x for x in stack.promql(query) if float(x["value"][1]) >= 5], 120,
                        f"{query} >= 5 in Prometheus", interval=3,
                        on_timeout=lambda: stack.engine.logs(stack.project))
    assert float(result[0]["value"][1]) >= 5
    targets = httpx.get(f"{stack.url('PROMETHEUS_PORT')}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    health = {t["labels"]["job"]: t["health"] for t in targets}
    assert health["serving-statistics"] == "up" and health["triton"] == "up", health


def test_predictions_are_logged_to_kafka_and_exported_with_their_feedback(stack):
    """docs/prediction-log.md in compose: the workers log to Kafka (a topic per deployment), ground truth is
    joined through the gateway, and `serving log export`, run in a worker container as a user would, reads
    the topic back with the feedback joined."""
    if not stack.client_key:
        pytest.fail("needs the model deployed by an earlier test", pytrace=False)
    stack.cli("endpoint", "log", "--endpoint", "clf", "--sample", "100%")
    ids = [f"compose-log-{i}" for i in range(5)]

    def exported(*extra: str) -> dict[str, dict]:
        stack.compose("exec", "-T", "worker", "serving", "log", "export", "--endpoint", "clf", "--format", "jsonl",
                      "--out", "/tmp/clf.jsonl", *extra)
        lines = stack.compose("exec", "-T", "worker", "cat", "/tmp/clf.jsonl").stdout.splitlines()
        return {row["request_id"]: row for row in map(json.loads, lines)}

    answers: dict[str, str] = {}

    def logged() -> bool:  # until the workers have the new setting: a request sent now is in the topic
        with stack.gateway() as client:
            for request_id in ids:
                r = client.post("/serve/clf", json={"text": TEXT}, headers={"X-Request-Id": request_id})
                assert r.status_code == 200, r.text
                answers[request_id] = r.json()["label"]
        return set(ids) <= set(exported())
    wait_until(logged, 120, "the requests in the Kafka topic", interval=3,
               on_timeout=lambda: stack.engine.logs(stack.project))
    with stack.gateway() as client:
        r = client.post("/serve/clf/feedback", json={"request_id": ids[0], "label": answers[ids[0]]})
    assert r.status_code == 200 and r.json()["correct"] is True, r.text
    rows = wait_until(lambda: (lambda got: got if got[ids[0]]["feedback_label"] else None)(exported("--with-feedback")),
                      60, "the feedback in the topic", interval=3)
    assert rows[ids[0]]["feedback_label"] == answers[ids[0]]
    assert json.loads(rows[ids[1]]["inputs"]) == {"text": TEXT} and rows[ids[1]]["status"] == 200


class SteadyLoad(Background):
    """POST /serve/clf through the gateway from a thread, one request after another, until stopped:
    every answer must be a 200 with the expected logits (any version: they are the same model)."""

    def __init__(self, stack: ComposeStack, expected: np.ndarray) -> None:
        super().__init__("steady-load")
        self.stack, self.expected = stack, expected
        self.versions: dict[str, int] = {}
        self.failures: list[str] = []

    @property
    def answers(self) -> int:
        return sum(self.versions.values())

    def run(self) -> None:
        with self.stack.gateway() as client:
            while not self.stopping.is_set():
                try:
                    r = client.post("/serve/clf", json={"text": TEXT})
                    if r.status_code != 200:
                        raise AssertionError(f"HTTP {r.status_code}: {r.text[:300]}")
                    np.testing.assert_allclose(r.json()["logits"], self.expected, atol=1e-4)
                    version = r.headers["X-Model-Version"]
                    self.versions[version] = self.versions.get(version, 0) + 1
                except Exception as exc:  # noqa: BLE001 - every kind of failure is counted and shown
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {exc!r}"[:500])
                self.stopping.wait(0.05)


def test_two_control_planes_a_leader_stopped_mid_rollout(stack, tiny_model):
    """docs/deploy-compose.md#high-availability-two-control-planes: control-plane-2 (``--profile ha``) on
    the same PostgreSQL and volumes, answering to "control-plane" on the compose network as well. The
    first control plane leads; a rollout of clf:2 (uploaded through the second) is started; once its
    first step has passed, the leader is stopped: the second leads, resumes the rollout at its step and
    promotes the candidate, while a steady load through the gateway gets every answer right. A console
    session signed in through the gateway (which spreads /console over both) stays signed in on every
    page, before and after the stop. Then the first is started again and the second removed, so the following test finds the stack as before."""
    if not stack.client_key:
        pytest.fail("needs the model deployed by an earlier test", pytrace=False)
    first, second = stack.url("CONTROL_PLANE_PORT"), stack.url("CONTROL_PLANE_2_PORT")
    admin = {"Authorization": f"Bearer {stack.settings['SERVING_ADMIN_TOKEN']}"}
    logs = lambda: stack.engine.logs(stack.project)  # noqa: E731

    def leads(url: str) -> bool:
        return httpx.get(f"{url}/leadership", timeout=5).json()["leader"]

    def container(service: str):
        return stack.engine.service_containers(stack.project).get(service)

    def healthy(service: str) -> bool:
        c = container(service)
        return c is not None and stack.engine.health(c) == "healthy"

    def ip(service: str) -> str:
        c = container(service)
        c.reload()
        (net,) = c.attrs["NetworkSettings"]["Networks"].values()
        return net["IPAddress"]

    def control_plane_addresses() -> set[str]:
        """What the name "control-plane" resolves to, asked in a worker container."""
        out = stack.compose("exec", "-T", "worker", "python", "-c",
                            "import socket; print(' '.join(sorted({a[4][0] for a in "
                            "socket.getaddrinfo('control-plane', 8080, type=socket.SOCK_STREAM)})))").stdout
        return set(out.split())

    def rollout() -> dict:
        r = httpx.get(f"{second}/rollouts", params={"endpoint": "clf"}, headers=admin, timeout=10)
        r.raise_for_status()
        return r.json()[0]

    console = stack.gateway(with_key=False)

    def console_pages() -> list[int]:
        return [console.get("/console/").status_code for _ in range(10)]

    expected = reference_logits(tiny_model, [TEXT])[0]
    figures: dict[str, object] = {}
    start = time.monotonic()
    try:
        stack.compose("--profile", "ha", "up", "-d", "control-plane-2")
        wait_until(lambda: healthy("control-plane-2"), 180, "control-plane-2 healthy", interval=2, on_timeout=logs)
        assert (leads(first), leads(second)) == (True, False)  # the first, started long before, leads
        assert httpx.get(f"{second}/health", timeout=5).json()["leader"] is False
        # one name, both containers: what workers, the statistics service and Triton ask for
        assert control_plane_addresses() == {ip("control-plane"), ip("control-plane-2")}
        figures["second up"] = time.monotonic() - start
        # the gateway's /console spreads requests over both; a console session (in the database) holds on each
        signed_in = console.post("/console/signin", data={"token": stack.settings["SERVING_ADMIN_TOKEN"]})
        assert signed_in.status_code in (302, 303), signed_in.text[:300]
        assert console_pages() == [200] * 10

        # the next version, uploaded through the follower (the artifact is on the shared volume)
        uploaded = stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path),
                             port="CONTROL_PLANE_2_PORT").stdout
        assert re.search(r"\bclf:2\b|version 2\b", uploaded), uploaded
        with SteadyLoad(stack, expected) as load:
            wait_until(lambda: load.answers >= 5, 60, "the load answered", on_timeout=lambda: str(load.failures))
            stack.cli("rollout", "start", "--endpoint", "clf", "--model", "clf:2", "--steps", "50,100",
                      "--interval", "8s")
            wait_until(lambda: rollout()["step"] >= 1, 90, "the rollout's first step passed", interval=0.2,
                       on_timeout=lambda: f"{rollout()}\n{logs()}")
            assert rollout()["state"] == "running"

            took_lead: list[float] = []

            def watch() -> None:
                while time.monotonic() - stopped_at < 60:
                    try:
                        if leads(second):
                            took_lead.append(time.monotonic() - stopped_at)
                            return
                    except (httpx.HTTPError, ValueError):
                        pass
                    time.sleep(0.05)

            stopped_at = time.monotonic()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            stack.compose("stop", "control-plane")
            figures["stop command"] = time.monotonic() - stopped_at
            watcher.join(70)
            assert took_lead, f"control-plane-2 did not lead within 60 s of the stop\n{logs()}"
            figures["takeover"] = took_lead[0]
            assert control_plane_addresses() == {ip("control-plane-2")}  # only the one up
            # still signed in, whichever replica signed the browser in
            wait_until(lambda: console_pages() == [200] * 10, 30, "the console signed in after the stop", interval=1)
            figures["console: 10 of 10 pages signed in, after the stop (s)"] = round(time.monotonic() - stopped_at, 1)

            r = wait_until(lambda: (lambda r: r if r["state"] != "running" else None)(rollout()), 90,
                           "the rollout finished", interval=0.5, on_timeout=lambda: f"{rollout()}\n{logs()}")
            figures["stop to promoted"] = time.monotonic() - stopped_at
            # the answers settle on the promoted version (workers follow control-plane-2's stream)
            wait_until(lambda: endpoint_answers(stack)["version"] == "2", 60, "clf:2 answering alone")
            time.sleep(1)  # a little load on the promoted version alone
        events = [e["event"] for e in r["history"]]
        assert r["state"] == "succeeded", r
        assert events.count("gates passed") == 1, events  # 50% -> 100%, taken once (the last is the promotion)
        assert len([e for e in events if e.startswith("promoted")]) == 1, events
        assert events.count("resumed after a control-plane restart") == 1, events  # by the new leader
        assert [e["step"] for e in r["history"] if e["event"] == "gates passed"] == [1]
        at = {e["event"].split(" ")[0]: datetime.fromisoformat(e["at"]) for e in r["history"]}
        figures["resumed to promoted (history)"] = (at["promoted:"] - at["resumed"]).total_seconds()
        listed = json.loads(stack.cli("endpoint", "list", "--json", port="CONTROL_PLANE_2_PORT").stdout)
        assert [(t["version"], t["weight"]) for ep in listed if ep["name"] == "clf" for t in ep["targets"]] == \
            [(2, 100.0)], listed
        figures.update(answers=load.answers, by_version=dict(sorted(load.versions.items())),
                       failed=len(load.failures))
        assert load.failures == [], f"{len(load.failures)} of {load.answers + len(load.failures)} failed: " \
                                    f"{load.failures[:10]}"
        assert load.versions.get("1") and load.versions.get("2"), load.versions
    finally:
        console.close()
        # as before for the following tests: the first control plane up, the second gone
        stack.compose("start", "control-plane")
        wait_until(lambda: healthy("control-plane"), 180, "control-plane healthy again", interval=2, on_timeout=logs)
        figures["first back, follows"] = not leads(first)
        removed = time.monotonic()
        stack.compose("--profile", "ha", "down", "control-plane-2")
        wait_until(lambda: leads(first), 30, "the first control plane leading again", interval=0.05)
        figures["second removed: first leads after"] = time.monotonic() - removed
        assert "control-plane-2" not in stack.engine.service_containers(stack.project)
        stack.times["two control planes"] = time.monotonic() - start
        print("\ntwo control planes: " + ", ".join(
            f"{k} {v:.2f} s" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    assert figures["first back, follows"]  # the second kept the lead
    assert control_plane_addresses() == {ip("control-plane")}


def test_down_and_up_again_keeps_the_registry_and_the_endpoints(stack, tiny_model):
    """... and, started again with plain HTTP asked for (COMPOSE_PROFILES=plain-http), the model
    answers both over HTTPS and over gateway-http."""
    before = stack.cli("endpoint", "list", "--json").stdout
    start = time.monotonic()
    stack.compose("down")
    assert stack.engine.containers(stack.project, all=True) == []
    stack.env["COMPOSE_PROFILES"] = "plain-http"
    stack.up()
    stack.times["down + up"] = time.monotonic() - start
    assert "gateway-http" in stack.engine.service_containers(stack.project)
    assert '"clf"' in stack.cli("model", "list", "--json").stdout
    expected = reference_logits(tiny_model, [TEXT])[0]
    wait_ready(stack, "clf ready again")
    # the listing carries the workers' live readiness too ("pending" until the worker's report that
    # it is back reaches the control plane): the same listing once it has
    listing = lambda: stack.cli("endpoint", "list", "--json").stdout  # noqa: E731
    wait_until(lambda: listing() == before, 30, "the same endpoint listing as before down",
               on_timeout=lambda: f"before:\n{before}\nnow:\n{listing()}")
    np.testing.assert_allclose(endpoint_answers(stack)["logits"], expected, atol=1e-4)
    wait_ready(stack, "clf ready over plain HTTP", plain_http=True)
    np.testing.assert_allclose(endpoint_answers(stack, plain_http=True)["logits"], expected, atol=1e-4)
