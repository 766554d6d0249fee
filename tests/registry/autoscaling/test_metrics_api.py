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
from registry.autoscaling.signals import Reading, Window
from registry.autoscaling.worker_load import WorkerLoad
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


def test_quantities_and_the_window_mean():
    assert [quantity(v) for v in (0, 0.0004, 2, 3.14159)] == ["0m", "0m", "2000m", "3142m"]
    now = [100.0]
    window = Window(10, clock=lambda: now[0])
    assert window.reading() is None
    for value in (2, 4, 9):
        window.add(value)
        now[0] += 4
    assert window.reading().value == pytest.approx((4 + 9) / 2)  # the sample at 100 s is older than 10 s at 112 s
    now[0] += 20
    assert window.reading() is None


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
    with serve_in_thread(worker_metrics(InFlight(3)), port), serve_in_thread(worker_metrics(InFlight(4)), port,
                                                                             "127.0.0.2"):
        sampler = WorkerLoad(f"workers.prod.svc:{port}", timeout_s=1.0)

        async def twice() -> None:
            async with httpx.AsyncClient(timeout=1.0) as client:
                await sampler.sample(client)
                await sampler.sample(client)

        asyncio.run(twice())
    reading = sampler.value()
    assert (reading.value, reading.samples, sampler.pods) == (7.0, 2, 2)
    assert sampler.name == IN_FLIGHT
    with pytest.raises(ValueError):
        WorkerLoad("no-port")
