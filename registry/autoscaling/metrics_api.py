"""Kubernetes' external metrics API (``external.metrics.k8s.io/v1beta1``), answered from the signals.

The API server's aggregation layer sends here what an HPA asks for its ``External`` metrics, once it
has authenticated and authorized the caller (the HPA controller) itself; this server only accepts
connections whose client certificate the cluster's front-proxy CA signed (the TLS set-up in
serve.py), so nothing but the API server reaches it. Answers are in Kubernetes' shapes: a
``ExternalMetricValueList`` of one item (the signal over the whole release, where a label selector narrows
nothing; an LLM engine's own, named by its selector: engine_signals.py), and a ``Status`` for what it does
not serve. One APIService per cluster names one server:
the release that enables it serves its own namespace and says so to others.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from registry.autoscaling.engine_signals import EngineSignals
from registry.autoscaling.signals import Reading, Signal, sampling

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"
BASE = f"/apis/{GROUP_VERSION}"


def quantity(value: float) -> str:
    """A Kubernetes quantity in thousandths ("3500m"), exact enough for any target."""
    return f"{round(value * 1000)}m"


def status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code}, status_code=code)


def value_list(name: str, reading: Reading) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(reading.at))
    return {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {},
            "items": [{"metricName": name, "metricLabels": {}, "timestamp": stamp, "value": quantity(reading.value)}]}


def create_metrics_app(signals: Sequence[Signal], namespace: str, samplers: Sequence[Any] = (),
                       engines: EngineSignals | None = None) -> FastAPI:
    """The API for ``signals`` in ``namespace``; ``samplers``' ``run()`` go on while it serves. ``engines``:
    each LLM engine's signals too, when the HPA's selector names one."""
    by_name = {s.name: s for s in signals}
    per_engine = engines.metrics if engines is not None else frozenset()

    stop = engines.close if engines is not None else (lambda: None)
    app = FastAPI(title="serving external metrics", lifespan=sampling(samplers, stop), docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/healthz")
    @app.get("/readyz")
    @app.get("/livez")
    def healthy() -> JSONResponse:
        return JSONResponse("ok")

    @app.get(BASE)
    def resources() -> dict[str, Any]:
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
                "resources": [{"name": name, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList",
                               "verbs": ["get"]} for name in sorted(set(by_name) | per_engine)]}

    @app.get(BASE + "/namespaces/{ns}/{metric}")
    async def metric(ns: str, metric: str, labelSelector: str = "") -> Any:  # noqa: N803 - Kubernetes' name
        signal = by_name.get(metric)
        if engines is not None and metric in per_engine and labelSelector:
            try:
                signal = engines.get(metric, labelSelector)
            except ValueError as exc:
                return status(400, "BadRequest", str(exc))
        if signal is None:
            served = ", ".join(sorted(set(by_name) | per_engine))
            return status(404, "NotFound", f"no external metric {metric!r} here; served: {served}")
        if ns != namespace:
            return status(404, "NotFound", f"{metric} is served for namespace {namespace!r} only (its release's "
                                           f"control plane), not {ns!r}")
        reading = signal.value()
        if reading is None:
            return status(503, "ServiceUnavailable", f"{metric}: no recent sample (no pod answered)")
        return value_list(metric, reading)

    return app
