"""A stdlib HTTP server run in a daemon thread: the small side endpoints of long-running processes
(the embedded Triton's load endpoint, a Triton pod's /ready). Why stdlib: a handful of requests, each
answered from memory or waiting on another process; no event loop to share."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


class JsonHandler(BaseHTTPRequestHandler):
    """A handler answering JSON, its access log at debug level (the kubelet probes every 2 s)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", type(self).__name__, format % args)

    def send_json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class HttpThread:
    """Serves ``handler`` on ``host:port`` from ``start`` until ``close``."""

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def start(self) -> "HttpThread":
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
