"""The signals as plain JSON, for KEDA's ``metrics-api`` scaler where a cluster runs KEDA instead of our APIService.

Only one server can answer ``external.metrics.k8s.io`` in a cluster; where KEDA holds it, its ``metrics-api``
trigger reads a number from an HTTP URL instead. This serves each signal of catalogue.py on a port of its own:

    GET /signals/<metric>    {"metric": ..., "value": 3.5, "samples": 10, "timestamp": "..."}

with the worker token as a bearer token (KEDA's ``authMode: bearer`` from a TriggerAuthentication naming the
chart's tokens Secret); 401 without it, 404 for a metric not served, 503 with no recent sample. The values are
the same objects the external metrics API reads (one sampling for both).
"""
from __future__ import annotations

import hmac
import time
from typing import Any, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from registry.autoscaling.signals import Signal, sampling


def create_signals_app(signals: Sequence[Signal], token: Callable[[], str | None], samplers: Sequence[Any] = ()) -> FastAPI:
    """``samplers``' ``run()`` go on while it serves (none when the metrics API's server runs them)."""
    by_name = {s.name: s for s in signals}

    app = FastAPI(title="serving signals", lifespan=sampling(samplers), docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthy() -> JSONResponse:
        return JSONResponse("ok")

    @app.get("/signals/{metric}")
    def signal(metric: str, request: Request) -> Any:
        expected = token()
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            return JSONResponse({"detail": "the worker token is needed (Authorization: Bearer ...)"}, status_code=401)
        found = by_name.get(metric)
        if found is None:
            return JSONResponse({"detail": f"no signal {metric!r}; served: {', '.join(sorted(by_name))}"}, status_code=404)
        reading = found.value()
        if reading is None:
            return JSONResponse({"detail": f"{metric}: no recent sample (no pod answered)"}, status_code=503)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(reading.at))
        return {"metric": metric, "value": reading.value, "samples": reading.samples, "timestamp": stamp}

    return app
