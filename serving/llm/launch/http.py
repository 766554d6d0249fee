"""The launcher's HTTP face, for workers: where each engine answers and whether it is ready.

    GET /engines   {"engines": {"<model>:<version>": {"url": "http://127.0.0.1:P/v1", "served_model_name",
                                                      "state": "starting"|"ready"|"failed", "error"}}}
    POST /engines/wake {"engine": "<key>"}  202: an engine scaled to zero starts again (its processes:
                   serving/llm/launch/sleep.py; on Kubernetes its pods: serving/llm/kube/idle.py); 404 for an
                   engine it does not run
    GET /health    200 once the launcher runs (`serving up` waits for it)
    GET /metrics   the engines' own metrics, labelled with endpoint and version (serving/llm/launch/metrics.py)

Bound to 127.0.0.1 by default (``SERVING_LLM_LAUNCHER_HOST``): it says only where engines on this host
listen. Stdlib ``ThreadingHTTPServer``: a few small reads per second from the workers.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)


Wake = Callable[[str], "dict[str, Any] | None"]
MAX_BODY = 4096


def _handler(view: Callable[[], dict[str, Any]], metrics: Callable[[], bytes],
             wake: Wake | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            log.debug("launcher %s", format % args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = urlsplit(self.path).path.rstrip("/")
            if path == "/engines":
                self._send(200, view())
            elif path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/metrics":
                data = metrics()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(404, {"detail": f"no route {path}; GET /engines"})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            path = urlsplit(self.path).path.rstrip("/")
            if path != "/engines/wake":
                self._send(404, {"detail": f"no route POST {path}; POST /engines/wake"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length)) if 0 < length <= MAX_BODY else None
                key = body["engine"] if isinstance(body, dict) and isinstance(body.get("engine"), str) else None
            except ValueError:
                key = None
            if key is None:
                self._send(400, {"detail": 'POST /engines/wake takes {"engine": "<engine key>"}'})
                return
            woken = wake(key) if wake is not None else None
            if woken is None:
                self._send(404, {"detail": f"no engine {key!r} here that can be woken"})
            else:
                self._send(202, woken)

    return Handler


class EnginesServer:
    def __init__(self, view: Callable[[], dict[str, Any]], host: str, port: int,
                 metrics: Callable[[], bytes] = lambda: b"", wake: Wake | None = None) -> None:
        self.server = ThreadingHTTPServer((host, port), _handler(view, metrics, wake))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="llm-engines-http", daemon=True)

    def start(self) -> "EnginesServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
