"""Run an ASGI app on a real loopback socket inside the test process."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import uvicorn

from tests.support.procs import free_port


@contextmanager
def serve_in_thread(app, port: int | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    port = port or free_port()
    with serve_config_in_thread(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               timeout_graceful_shutdown=1)):
        yield f"http://{host}:{port}"


@contextmanager
def serve_config_in_thread(config: uvicorn.Config) -> Iterator[uvicorn.Server]:
    """A server of any uvicorn config (TLS, a lifespan), started and stopped around the block."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
