"""The control plane's external metrics API (registry/autoscaling/): Kubernetes' shapes, the TLS server that
admits only a client certificate of the front-proxy CA (real sockets, certificates made with openssl), and
the workers' load sampled from real servers answering a worker's ``/metrics``."""
from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Response
from fastapi.testclient import TestClient

from registry.autoscaling.metrics_api import BASE, create_metrics_app, quantity
from registry.autoscaling.serve import metrics_api_config
from registry.autoscaling.catalogue import signals
from registry.autoscaling.pod_metrics import IncreaseRatio, PodScrape, PodsGauge
from registry.autoscaling.signals import Reading
from serving.settings import ControlPlaneSettings
from serving import dns
from serving.load_metrics import IN_FLIGHT
from serving.worker.load import InFlight, metrics_text
from tests.support.procs import free_port
from tests.support.servers import serve_config_in_thread, serve_in_thread

NAME = "serving_worker_requests_in_flight"


class Fixed:
    name = NAME

    def __init__(self, reading: Reading | None) -> None:
        self.reading = reading

    def value(self) -> Reading | None:
        return self.reading


def test_values_resources_and_refusals_in_kubernetes_shapes():
    signal = Fixed(Reading(3.5, 1_800_000_000.0, 10))
    client = TestClient(create_metrics_app([signal], "prod"))
    r = client.get(f"{BASE}/namespaces/prod/{NAME}", params={"labelSelector": "a=b"})
    assert r.status_code == 200
    assert r.json() == {"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
                        "metadata": {}, "items": [{"metricName": NAME, "metricLabels": {},
                                                   "timestamp": "2027-01-15T08:00:00Z", "value": "3500m"}]}
    listed = client.get(BASE).json()
    assert listed["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert [(x["name"], x["namespaced"], x["verbs"]) for x in listed["resources"]] == [(NAME, True, ["get"])]
    other = client.get(f"{BASE}/namespaces/dev/{NAME}")
    assert (other.status_code, other.json()["kind"], other.json()["reason"]) == (404, "Status", "NotFound")
    assert "namespace 'prod' only" in other.json()["message"]
    unknown = client.get(f"{BASE}/namespaces/prod/cpu")
    assert unknown.status_code == 404 and NAME in unknown.json()["message"]
    signal.reading = None
    idle = client.get(f"{BASE}/namespaces/prod/{NAME}")
    assert (idle.status_code, idle.json()["reason"]) == (503, "ServiceUnavailable")


def test_quantities():
    assert [quantity(v) for v in (0, 0.0004, 2, 3.14159)] == ["0m", "0m", "2000m", "3142m"]


def scraped(now: list[float], *samples: dict[str, dict[str, float]]) -> PodScrape:
    """A scrape holding these samples, one a second up to ``now``."""
    scrape = PodScrape("pods.test:9", set(), window_s=10, clock=lambda: now[0])
    for i, pods in enumerate(samples):
        scrape.samples.append((now[0] - len(samples) + 1 + i, 1_800_000_000.0 + i, pods))
    return scrape


def test_a_gauge_is_summed_or_averaged_over_the_pods_then_over_the_window():
    now = [100.0]
    scrape = scraped(now, {"a": {"g": 1}, "b": {"g": 3}}, {"a": {"g": 2}, "b": {"g": 6}, "c": {}})
    assert PodsGauge("s", scrape, ("g",), "sum").value().value == pytest.approx((4 + 8) / 2)
    assert PodsGauge("m", scrape, ("g",), "mean").value().value == pytest.approx((2 + 4) / 2)
    renamed = scraped(now, {"a": {"old": 0.5}, "b": {"new": 0.7}})  # an engine's gauge under either name
    assert PodsGauge("kv", renamed, ("new", "old"), "mean").value().value == pytest.approx(0.6)
    now[0] += 30  # every sample out of the window
    assert PodsGauge("s", scrape, ("g",), "sum").value() is None


def test_a_ratio_of_increases_leaves_out_pods_that_restarted_or_came_late():
    now = [100.0]
    first = {"a": {"q": 1000, "n": 10}, "b": {"q": 5000, "n": 50}, "c": {"q": 1, "n": 1}}
    last = {"a": {"q": 4000, "n": 20}, "b": {"q": 100, "n": 2}, "c": {"q": 601, "n": 3}, "d": {"q": 9e9, "n": 9}}
    ratio = IncreaseRatio("ms", scraped(now, first, last), "q", "n", scale=1e-3).value()
    assert ratio.value == pytest.approx(1e-3 * (3000 + 600) / (10 + 2))  # b restarted, d is new
    idle = IncreaseRatio("ms", scraped(now, first, first), "q", "n").value()
    assert idle.value == 0.0
    assert IncreaseRatio("ms", scraped(now, first), "q", "n").value() is None  # one sample: no increase yet


def test_a_counter_is_found_under_the_name_its_server_gives_it():
    from registry.autoscaling.pod_metrics import wanted

    metrics = {"nv_inference_request_success", "vllm:generation_tokens_total"}
    assert wanted("nv_inference_request_success_total", metrics) == "nv_inference_request_success"  # the parser's
    assert wanted("vllm:generation_tokens_total", metrics) == "vllm:generation_tokens_total"
    assert wanted("other_total", metrics) is None


def test_the_catalogue_serves_each_kinds_signals():
    served = signals(workers="w:9090", triton="t:8002", llm="l:8000")
    assert [s.name for s in served.signals] == [
        "serving_worker_requests_in_flight", "serving_triton_pending_requests", "serving_triton_queue_ms",
        "serving_llm_waiting_requests", "serving_llm_kv_cache_usage", "serving_llm_ttft_ms"]
    assert [(s.host, s.port) for s in served.scrapes] == [("w", 9090), ("t", 8002), ("l", 8000)]
    assert signals().signals == []


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def ca(tmp: Path, name: str) -> tuple[Path, Path]:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
            "-keyout", str(tmp / f"{name}.key"), "-out", str(tmp / f"{name}.crt"))
    return tmp / f"{name}.crt", tmp / f"{name}.key"


def signed(tmp: Path, name: str, by: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    (tmp / f"{name}.ext").write_text(ext)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(tmp / f"{name}.key"),
            "-out", str(tmp / f"{name}.csr"))
    openssl("x509", "-req", "-in", str(tmp / f"{name}.csr"), "-CA", str(by[0]), "-CAkey", str(by[1]), "-CAcreateserial",
            "-days", "1", "-extfile", str(tmp / f"{name}.ext"), "-out", str(tmp / f"{name}.crt"))
    return tmp / f"{name}.crt", tmp / f"{name}.key"


def test_only_the_front_proxy_cas_client_certificate_is_admitted(tmp_path):
    serving_ca, proxy_ca, stranger_ca = ca(tmp_path, "serving-ca"), ca(tmp_path, "proxy-ca"), ca(tmp_path, "stranger-ca")
    cert, key = signed(tmp_path, "metrics", serving_ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    proxy = signed(tmp_path, "front-proxy-client", proxy_ca, "extendedKeyUsage=clientAuth\n")
    stranger = signed(tmp_path, "stranger", stranger_ca, "extendedKeyUsage=clientAuth\n")
    port = free_port()
    settings = ControlPlaneSettings(home=tmp_path / "home", control_plane_host="127.0.0.1", metrics_api_port=port,
                                    metrics_api_cert=cert, metrics_api_key=key, metrics_api_client_ca=proxy_ca[0],
                                    autoscaling_namespace="prod")
    config = metrics_api_config(settings)
    assert config is not None
    url = f"https://127.0.0.1:{port}{BASE}"

    def get(client_cert: tuple[Path, Path] | None) -> int:
        context = ssl.create_default_context(cafile=str(serving_ca[0]))
        if client_cert is not None:
            context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        return httpx.get(url, verify=context, timeout=10).status_code

    with serve_config_in_thread(config):
        assert get(proxy) == 200
        for refused in (None, stranger):  # no certificate; one of another CA (the handshake fails either way)
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                get(refused)


def test_the_metrics_api_is_off_without_its_certificates_or_a_client_ca(tmp_path, caplog):
    settings = ControlPlaneSettings(home=tmp_path, metrics_api_port=free_port())
    assert metrics_api_config(settings) is None
    assert "SERVING_METRICS_API_CERT" in caplog.text
    settings = ControlPlaneSettings(home=tmp_path, metrics_api_port=free_port(), metrics_api_cert=tmp_path / "c",
                                    metrics_api_key=tmp_path / "k")
    assert metrics_api_config(settings) is None  # not in a pod here
    assert "SERVING_METRICS_API_CLIENT_CA" in caplog.text


def worker_metrics(load: InFlight) -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await metrics_text(load))

    return app


def test_the_load_is_the_sum_over_the_pods_that_answer(monkeypatch):
    """Two pods on 127.0.0.1 and 127.0.0.2 (one port, as behind a headless Service) and a third address
    where nothing listens: the sample is 3 + 4 from the two that answered."""
    port = free_port()
    monkeypatch.setattr(dns, "addresses", lambda host, p, what: [(2, "127.0.0.1"), (2, "127.0.0.2"), (2, "127.0.0.3")])
    served = signals(workers=f"workers.prod.svc:{port}")
    (scrape,), (load,) = served.scrapes, served.signals
    scrape.timeout_s = 1.0
    with serve_in_thread(worker_metrics(InFlight(3)), port), serve_in_thread(worker_metrics(InFlight(4)), port,
                                                                             "127.0.0.2"):
        async def twice() -> None:
            async with httpx.AsyncClient(timeout=1.0) as client:
                await scrape.sample(client)
                await scrape.sample(client)

        asyncio.run(twice())
    reading = load.value()
    assert (reading.value, reading.samples, scrape.pods) == (7.0, 2, 2)
    assert load.name == IN_FLIGHT
    with pytest.raises(ValueError):
        PodScrape("no-port", set())


def vllm_metrics(waiting: float) -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n",
                        media_type="text/plain")
    return app


def test_an_engines_signals_are_read_from_its_own_pods_when_its_selector_names_it():
    """Each engine's HPA names its engine (serving.io/engine=<name>, the name of its headless Service): the
    first ask starts reading that name's pods (here ``localhost``, a real server answering vLLM's gauge), and
    answers once sampled; a selector naming no engine is refused in Kubernetes' shape."""
    from registry.autoscaling.engine_signals import EngineSignals

    port, metric = free_port(), "serving_llm_waiting_requests"
    with serve_in_thread(vllm_metrics(5), port), \
            TestClient(create_metrics_app([], "prod", engines=EngineSignals(port))) as client:
        url = f"{BASE}/namespaces/prod/{metric}"
        assert metric in [r["name"] for r in client.get(BASE).json()["resources"]]
        first = client.get(url, params={"labelSelector": "serving.io/engine=localhost"})
        assert (first.status_code, first.json()["reason"]) == (503, "ServiceUnavailable")  # not sampled yet

        def sampled():
            r = client.get(url, params={"labelSelector": "serving.io/engine=localhost"})
            return r.status_code == 200 and r.json()["items"][0]["value"]
        from tests.support.procs import wait_until

        assert wait_until(sampled, 10, "the engine's pods sampled") == "5000m"
        bad = client.get(url, params={"labelSelector": "app=x"})
        assert (bad.status_code, bad.json()["reason"]) == (400, "BadRequest")
        assert "serving.io/engine=<engine>" in bad.json()["message"]
        # without a selector an LLM signal is the release-wide one: none here
        assert client.get(url).status_code == 404


def test_keda_reads_the_same_signals_as_json_with_the_worker_token(monkeypatch):
    """The control plane with only SERVING_SIGNALS_PORT (a cluster where KEDA holds the external metrics API):
    its own server samples the workers (a real server answering a worker's /metrics) and answers KEDA's
    metrics-api scaler, which sends the worker token as a bearer token."""
    from registry.autoscaling.serve import autoscaling_configs

    pod, port = free_port(), free_port()
    monkeypatch.setenv("SERVING_WORKER_TOKEN", "wt-secret")
    settings = ControlPlaneSettings(signals_port=port, autoscaling_workers=f"localhost:{pod}", control_plane_host="127.0.0.1")
    (config,) = autoscaling_configs(settings)
    with serve_in_thread(worker_metrics(InFlight(3)), pod), serve_config_in_thread(config):
        url = f"http://127.0.0.1:{port}/signals/{IN_FLIGHT}"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401

        def value():
            r = httpx.get(url, headers={"Authorization": "Bearer wt-secret"})
            return r.status_code == 200 and r.json()
        from tests.support.procs import wait_until

        body = wait_until(value, 10, "the workers sampled")
        assert body["metric"] == IN_FLIGHT and body["value"] == 3.0 and body["samples"] >= 1
        missing = httpx.get(f"http://127.0.0.1:{port}/signals/cpu", headers={"Authorization": "Bearer wt-secret"})
        assert missing.status_code == 404 and IN_FLIGHT in missing.json()["detail"]
