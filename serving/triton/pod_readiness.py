"""A Triton pod's readiness: ready once it holds every deployed model, on an HTTP port of its own.

Why not Triton's ``/v2/health/ready``: in explicit model-control mode it is true as soon as the
server is up, before a single model is loaded, so a new Triton pod would join its Service (and
the workers' address list) empty, and every call sent there would miss its model. What loads
the models (the embedded Triton, serving/triton/embedded.py, or the sidecar beside NVIDIA's
image, serving/triton/sidecar.py) knows what is deployed and what it has loaded; it serves

    GET /ready   200 once a configuration was received and every deployed model is loaded
                 (or refused by Triton: see below), else 503; the body names what is waited on
    GET /live    200 while the process runs

Only the *first* load gates: once a pod was ready it stays ready while it loads a model deployed
later (the workers' readiness gate holds a new version back until every live Triton has it).
Otherwise every deployment would take every Triton pod out of its Service at the same moment.
The latch is dropped when Triton lost its models (a restarted tritonserver): then the pod waits
for them again.

A model Triton *refused* (a broken file, an unservable format) does not hold the pod back: it
would be refused on every pod alike, and keeping them all out of service would take every other
model down with it. It is named in the body and in the readiness report. A load that could not
be *tried* (the control plane or Triton unreachable, the artifact not downloaded yet) does hold
it back: that one will succeed later. Plain stdlib HTTP server, no auth: the body names models
and nothing else, and only the kubelet asks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

import httpx

from serving.http_thread import HttpThread, JsonHandler

log = logging.getLogger(__name__)


def could_not_try(exc: BaseException) -> bool:
    """A load that failed before Triton could judge the model (worth waiting for), as opposed
    to one Triton (or the model's format) refused."""
    return isinstance(exc, (OSError, httpx.HTTPError, TimeoutError))


@dataclass
class LoadState:
    """What a loader knows, for /ready: the deployed models, and which are loaded or refused."""

    configured: bool = False  # a configuration (snapshot) was received
    wanted: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # name -> why

    def waiting(self) -> list[str]:
        return sorted(self.wanted - self.loaded - set(self.refused))

    def report(self) -> dict[str, Any]:
        waiting = self.waiting()
        return {"ready": self.configured and not waiting, "configured": self.configured, "waiting": waiting,
                "loaded": sorted(self.wanted & self.loaded),
                "refused": {n: why for n, why in self.refused.items() if n in self.wanted}}


class Latch:
    """Ready stays ready once reached (see the module docstring), until ``reset``."""

    def __init__(self) -> None:
        self.reached = False

    def report(self, state: LoadState) -> dict[str, Any]:
        report = state.report()
        self.reached = self.reached or report["ready"]
        report["ready"] = self.reached
        return report

    def reset(self) -> None:
        self.reached = False


def _handler(state: Callable[[], dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/live":
                self.send_json(200, {"live": True})
            elif path == "/ready":
                try:
                    body = state()
                except Exception as exc:  # never a 200 by accident
                    body = {"ready": False, "error": str(exc)}
                self.send_json(200 if body.get("ready") else 503, body)
            else:
                self.send_json(404, {"detail": "GET /ready or /live"})

    return Handler


class ReadinessServer(HttpThread):
    """Serves /ready and /live until ``close``; ``state`` returns the report (``Latch.report``)."""

    def __init__(self, host: str, port: int, state: Callable[[], dict[str, Any]]) -> None:
        super().__init__(host, port, _handler(state), "triton-readiness")
