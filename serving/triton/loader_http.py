"""The embedded Triton's load-on-demand endpoint, for workers whose model is cold.

Why an endpoint of our own rather than Triton's repository API: a load must go through the
budget (unload the least recently used idle models first, never two loads at once, one load for
many waiting requests), which Triton's API knows nothing of; and that API is guarded by a token
only the embedded Triton process holds. Workers present the worker token they already hold for
the config stream (``Authorization: Bearer``). Stdlib ``ThreadingHTTPServer``: a handful of
requests per cold model, each mostly waiting on Triton.

    GET  /models                 the budget: {"budget_bytes", "used_bytes", "models": {name: {...}}}
    GET  /models/{name}          one model's state (loaded, cold, loading, failed, pending), 404 unknown
    POST /models/{name}/load     returns once the model is loaded: 200 {"load_s"}; 404 not loadable,
                                 503 (Retry-After) while busy models hold the budget, 502 load failed
"""
from __future__ import annotations

import hmac
import logging
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from serving.http_thread import HttpThread, JsonHandler
from serving.triton.loader import BudgetBusy, LoadFailed, ModelLoader, NotLoadable

log = logging.getLogger(__name__)

MAX_WAIT_S = 300.0


def _handler(loader: ModelLoader, token: Callable[[], str | None]) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _send(self, status: int, body: dict[str, Any], retry_after: int | None = None) -> None:
            self.send_json(status, body, {"Retry-After": str(retry_after)} if retry_after is not None else None)

        def _authorized(self) -> bool:
            expected = token()
            if not expected:  # no worker token on this box (a bare test setup): loopback only
                return self.client_address[0] in ("127.0.0.1", "::1")
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
                return True
            self._send(401, {"detail": "the load endpoint needs the worker token (Authorization: Bearer)"})
            return False

        def _parts(self) -> list[str]:
            return [p for p in urlsplit(self.path).path.split("/") if p]

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if not self._authorized():
                return
            parts, status = self._parts(), loader.status()
            if parts == ["models"]:
                self._send(200, status)
            elif len(parts) == 2 and parts[0] == "models" and parts[1] in status["models"]:
                self._send(200, {"name": parts[1], **status["models"][parts[1]]})
            else:
                self._send(404, {"detail": f"no model at {self.path}"})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            if not self._authorized():
                return
            parts = self._parts()
            if len(parts) != 3 or parts[0] != "models" or parts[2] != "load":
                self._send(404, {"detail": f"no route {self.path}; POST /models/NAME/load"})
                return
            query = parse_qs(urlsplit(self.path).query)
            try:
                wait = min(MAX_WAIT_S, float(query.get("timeout_s", ["60"])[0]))
            except ValueError:
                self._send(400, {"detail": "timeout_s must be a number of seconds"})
                return
            try:
                self._send(200, {"name": parts[1], "load_s": round(loader.ensure(parts[1], wait), 3)})
            except NotLoadable as exc:
                self._send(404, {"detail": str(exc)})
            except BudgetBusy as exc:
                self._send(503, {"detail": str(exc)}, retry_after=1)
            except LoadFailed as exc:
                self._send(502, {"detail": str(exc)})
            except Exception as exc:  # Triton down or restarting: the worker retries
                log.exception("on-demand load of %s failed", parts[1])
                self._send(503, {"detail": f"cannot load {parts[1]} now: {exc}"}, retry_after=1)

    return Handler


class LoaderServer(HttpThread):
    """Serves the endpoint in a thread until ``close``."""

    def __init__(self, loader: ModelLoader, host: str, port: int, token: Callable[[], str | None]) -> None:
        super().__init__(host, port, _handler(loader, token), "triton-loader")
