"""deploy/docker-compose.yml, run for real: images built, `compose up`, a model served through it.

Where a container engine can run (podman here; Docker works the same way, see tests/deploy/engine.py):

1. ``scripts/images.sh`` builds the images with no registry: a Debian base (debootstrap, cached),
   the project's image from the Dockerfile, and stand-ins for the public images that cannot be
   pulled (deploy/docker-compose.stand-ins.yml says which and why: Triton -> the project's image
   running the embedded Triton, Postgres/Prometheus/nginx -> Debian's packages, Kafka -> Tansu;
   Grafana is not started).
2. ``compose up`` of the shipped compose file plus that override, on free loopback ports, under
   a project name of its own; every service with a healthcheck must become healthy.
3. A small BERT classifier is uploaded and deployed with the `serving` CLI against the composed
   control plane, answered through the gateway and the composed workers (compared with
   onnxruntime run here on the same input), and the requests are counted in the composed
   Prometheus (PromQL over its HTTP API).
4. ``compose down`` and ``up`` again on the same volumes: the registry and endpoints are still
   there and the model answers again. Containers, volumes and networks are removed at the end.

Skipped, with the reason, where no engine can run containers (tests/deploy/engine.py:why_not).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.deploy.artifacts import DEPLOY, REPO, compose
from tests.deploy.compose_env import read_env_file
from tests.deploy.engine import Engine, why_not
from tests.support.procs import free_port

FILES = ["docker-compose.yml", "docker-compose.stand-ins.yml"]
HEALTHY_SERVICES = {"postgres", "kafka", "control-plane", "triton", "statistics", "worker"}
RUNNING_SERVICES = HEALTHY_SERVICES | {"gateway", "prometheus"}
TEXT = "the service was quick and the staff were friendly"

pytestmark = pytest.mark.timeout(1500)

_why = why_not()
if _why is not None and os.environ.get("SERVING_TEST_COMPOSE") == "1":
    raise RuntimeError(f"SERVING_TEST_COMPOSE=1 but no container engine can run here: {_why}")
if _why is not None:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"compose stack not run: {_why}")]


def secrets_token() -> str:
    return secrets.token_hex(16)


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

    def __init__(self, engine: Engine, workdir: Path) -> None:
        self.engine = engine
        self.project = f"serving-test-{uuid.uuid4().hex[:8]}"
        self.ports = {name: free_port() for name in
                      ("CONTROL_PLANE_PORT", "WORKER_GATEWAY_PORT", "STATISTICS_PORT", "PROMETHEUS_PORT",
                       "GRAFANA_PORT", "TRITON_HTTP_PORT")}
        # podman-compose does not implement `configs`: the gateway's configuration, exactly as the
        # compose file gives it (after Compose's interpolation), goes in as a file.
        gateway_conf = workdir / "gateway.conf"
        gateway_conf.write_text(compose()["configs"]["gateway-conf"]["content"])
        # The settings deploy/init-env.sh would write (the template plus fresh secrets), given in
        # the environment, which Compose prefers to deploy/.env: a developer's .env is not used.
        generated = {k: secrets_token() for k in ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD")}
        generated.update({k: f"srv_{secrets_token()}" for k in ("SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")})
        self.settings = {**read_env_file(DEPLOY / ".env.example"), **generated,
                         **{k: str(p) for k, p in self.ports.items()},
                         # the gateway is the one port published beyond the host: loopback here
                         "WORKER_GATEWAY_PORT": f"127.0.0.1:{self.ports['WORKER_GATEWAY_PORT']}"}
        self.env = {**engine.env, **self.settings, "SERVING_GATEWAY_CONF": str(gateway_conf)}
        self.times: dict[str, float] = {}

    def url(self, port_name: str) -> str:
        return f"http://127.0.0.1:{self.ports[port_name]}"

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

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """The `serving` CLI of this checkout, against the composed control plane."""
        cmd = [sys.executable, "-m", "serving.cli.main", "--control-plane", self.url("CONTROL_PLANE_PORT"), *args]
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


def reference_logits(bundle, texts: list[str]) -> np.ndarray:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0]


@pytest.fixture(scope="module")
def engine():
    eng = Engine.start()
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def images(engine):
    """scripts/images.sh: the base image comes from its cache when present.
    ``SERVING_TEST_BUILD=0`` uses the images already built (e.g. from another checkout)."""
    start = time.monotonic()
    if os.environ.get("SERVING_TEST_BUILD") == "0":
        return 0.0
    out = subprocess.run(["bash", str(REPO / "scripts" / "images.sh")], cwd=REPO, env=engine.env,
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, f"scripts/images.sh failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return time.monotonic() - start


@pytest.fixture(scope="module")
def stack(engine, images, tmp_path_factory):
    s = ComposeStack(engine, tmp_path_factory.mktemp("compose"))
    s.times["images"] = images
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
        print(f"\ncompose test timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in s.times.items()))


def endpoint_answers(stack: ComposeStack, bundle) -> dict:
    """POST /serve/clf through the gateway (nginx -> a composed worker -> composed Triton)."""
    r = httpx.post(f"{stack.url('WORKER_GATEWAY_PORT')}/serve/clf", json={"text": TEXT}, timeout=30)
    assert r.status_code == 200, r.text
    return {"version": r.headers["X-Model-Version"], **r.json()}


def test_every_service_is_up_and_healthy(stack, engine):
    by_service = engine.service_containers(stack.project)
    assert RUNNING_SERVICES <= set(by_service), sorted(by_service)
    assert "grafana" not in by_service  # no image for it here (see the override)
    assert httpx.get(f"{stack.url('CONTROL_PLANE_PORT')}/health", timeout=5).json()["status"] == "ok"
    # the image's HEALTHCHECK survived the build (podman builds in docker format for it)
    worker = by_service["worker"]
    assert worker.attrs["Config"]["Healthcheck"]["Test"][-1] == "serving-healthcheck"
    assert worker.attrs["Config"]["User"] == "10001:10001"


def test_a_model_deployed_with_the_cli_answers_through_the_composed_worker(stack, tiny_model):
    stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
    stack.cli("model", "add", "--endpoint", "clf", "--model", "clf:1", "--tokenizer", str(tiny_model.tokenizer_dir),
              "--labels", ",".join(tiny_model.labels))
    ready = f"{stack.url('WORKER_GATEWAY_PORT')}/v2/models/clf/ready"
    wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 120, "clf ready behind the gateway",
               on_timeout=lambda: stack.engine.logs(stack.project))
    got = endpoint_answers(stack, tiny_model)
    expected = reference_logits(tiny_model, [TEXT])[0]
    assert got["version"] == "1"
    np.testing.assert_allclose(got["logits"], expected, atol=1e-4)
    assert got["label"] == tiny_model.labels[int(np.argmax(expected))]


def test_the_requests_are_counted_in_the_composed_prometheus(stack):
    for _ in range(4):
        r = httpx.post(f"{stack.url('WORKER_GATEWAY_PORT')}/serve/clf", json={"text": TEXT}, timeout=30)
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


def test_down_and_up_again_keeps_the_registry_and_the_endpoints(stack, tiny_model):
    before = stack.cli("endpoint", "list", "--json").stdout
    start = time.monotonic()
    stack.compose("down")
    assert stack.engine.containers(stack.project, all=True) == []
    stack.up()
    stack.times["down + up"] = time.monotonic() - start
    assert stack.cli("endpoint", "list", "--json").stdout == before
    assert '"clf"' in stack.cli("model", "list", "--json").stdout
    ready = f"{stack.url('WORKER_GATEWAY_PORT')}/v2/models/clf/ready"
    wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 120, "clf ready again",
               on_timeout=lambda: stack.engine.logs(stack.project))
    np.testing.assert_allclose(endpoint_answers(stack, tiny_model)["logits"],
                               reference_logits(tiny_model, [TEXT])[0], atol=1e-4)
