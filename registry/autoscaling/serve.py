"""The external metrics API's server: TLS with the chart's serving certificate, and only clients whose
certificate the cluster's front-proxy CA signed.

That CA is what the API server's aggregation layer presents when it proxies a request here. It is
read from ``kube-system/extension-apiserver-authentication`` (key ``requestheader-client-ca-file``),
which the API server writes at its start and the chart lets the control plane read, unless a file is
named (SERVING_METRICS_API_CLIENT_CA). uvicorn checks it in the handshake; what it cannot check is
the certificate's name (``--requestheader-allowed-names``), as uvicorn does not hand the peer's
certificate to the app. Without its certificates or that CA the control plane still serves
everything else, and says why the metrics API is off (an HPA then holds its scale).
"""
from __future__ import annotations

import logging
import ssl
from pathlib import Path

import uvicorn

from registry.autoscaling.metrics_api import create_metrics_app
from registry.autoscaling.catalogue import Signals, signals
from registry.autoscaling.signals_http import create_signals_app
from registry.autoscaling.engine_signals import EngineSignals
from serving.kube_api import InCluster, KubeError
from serving.settings import ControlPlaneSettings

log = logging.getLogger(__name__)

AUTHENTICATION = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
CA_KEY = "requestheader-client-ca-file"


def front_proxy_ca(cluster: InCluster, dest: Path) -> Path:
    """The cluster's front-proxy CA bundle, written to ``dest``."""
    data = cluster.get(AUTHENTICATION).get("data") or {}
    if not data.get(CA_KEY):
        raise KubeError(f"{AUTHENTICATION} has no {CA_KEY}: the API server runs without --requestheader-client-ca-file, "
                        "so it cannot proxy to an aggregated API")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(data[CA_KEY])
    return dest


def autoscaling_configs(settings: ControlPlaneSettings) -> list[uvicorn.Config]:
    """The servers of the signals: the external metrics API (SERVING_METRICS_API_PORT, when it can run) and the
    plain JSON one for KEDA (SERVING_SIGNALS_PORT), sharing one sampling of the pods."""
    served = signals(settings.autoscaling_workers, settings.autoscaling_triton, settings.autoscaling_llm)
    configs = []
    if settings.metrics_api_port:
        metrics = metrics_api_config(settings, served)
        if metrics is not None:
            configs.append(metrics)
    if settings.signals_port:
        from serving.credentials import worker_token

        # the metrics API's server samples the pods; without it, this one does
        app = create_signals_app(served.signals, lambda: worker_token(settings), () if configs else served.scrapes)
        configs.append(uvicorn.Config(app, host=settings.control_plane_host, port=settings.signals_port,
                                      log_level="warning", timeout_graceful_shutdown=2))
    return configs


def metrics_api_config(settings: ControlPlaneSettings, served: Signals | None = None) -> uvicorn.Config | None:
    """The server for SERVING_METRICS_API_PORT, or None (logged why) when it cannot run."""
    if not (settings.metrics_api_cert and settings.metrics_api_key):
        log.error("the metrics API is off: SERVING_METRICS_API_CERT and SERVING_METRICS_API_KEY are needed")
        return None
    cluster = InCluster.from_pod()
    ca = settings.metrics_api_client_ca
    if ca is None:
        if cluster is None:
            log.error("the metrics API is off: not in a pod, and SERVING_METRICS_API_CLIENT_CA is not set")
            return None
        try:
            ca = front_proxy_ca(cluster, settings.home / "front-proxy-ca.crt")
        except KubeError as exc:
            log.error("the metrics API is off: the front-proxy CA could not be read: %s", exc)
            return None
    namespace = settings.autoscaling_namespace or (cluster.namespace if cluster else "default")
    served = served or signals(settings.autoscaling_workers, settings.autoscaling_triton, settings.autoscaling_llm)
    engines = EngineSignals(settings.autoscaling_llm_engines_port) if settings.autoscaling_llm_engines_port else None
    app = create_metrics_app(served.signals, namespace, samplers=served.scrapes, engines=engines)
    return uvicorn.Config(app, host=settings.control_plane_host, port=settings.metrics_api_port, log_level="warning",
                          ssl_certfile=str(settings.metrics_api_cert), ssl_keyfile=str(settings.metrics_api_key),
                          ssl_ca_certs=str(ca), ssl_cert_reqs=ssl.CERT_REQUIRED, timeout_graceful_shutdown=2)
