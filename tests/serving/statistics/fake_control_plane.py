"""A stand-in control plane: ``GET /config`` and the ``GET /config/stream`` SSE feed.

The statistics tests need metric definitions (``metrics``, ``log_freq``) in the
snapshot format of docs/architecture.md, independent of the registry's CLI; this
serves exactly that format from a real HTTP server on a loopback port, and lets a
test publish a new snapshot the way a registry commit would.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.procs import free_port


class FakeControlPlane:
    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self._changed = threading.Condition()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._stopped = False

    def publish(self, snapshot: dict[str, Any]) -> None:
        with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    def start(self) -> "FakeControlPlane":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        with self._changed:
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/config":
                    body = json.dumps(plane.snapshot).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/config/stream":
                    self._stream()
                else:
                    self.send_error(404)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                sent = None
                try:
                    while not plane._stopped:
                        with plane._changed:
                            if plane.snapshot is sent:
                                plane._changed.wait(5.0)
                            current = plane.snapshot
                        if current is sent:
                            self.wfile.write(b": keepalive\n\n")
                        else:
                            self.wfile.write(f"event: config\ndata: {json.dumps(current)}\n\n".encode())
                            sent = current
                        self.wfile.flush()
                except OSError:
                    return

        return Handler
