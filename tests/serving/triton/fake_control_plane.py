"""A tiny stand-in for the control plane, just enough for the embedded Triton to follow.

The real control plane (registry/api.py) is built by another part of the project;
these tests exercise the Triton side against the contract in docs/architecture.md:
``GET /config/stream`` (SSE, ``event: config``) and ``GET /artifacts/{sha256}``.
It is a real FastAPI app served by uvicorn on a free loopback port.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse

from tests.support.procs import free_port, wait_http


class FakeControlPlane:
    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {"revision": 0, "endpoints": {}}
        self.artifacts: dict[str, Path] = {}
        self.app = self._make_app()

    def add_artifact(self, path: Path) -> str:
        sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        self.artifacts[sha] = Path(path)
        return sha

    def publish(self, endpoints: dict[str, Any]) -> None:
        self.snapshot = {"revision": self.snapshot["revision"] + 1, "endpoints": endpoints}

    def _make_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        def health() -> dict:
            return {"status": "ok"}

        @app.get("/artifacts/{sha}")
        def artifact(sha: str) -> FileResponse:
            if sha not in self.artifacts:
                raise HTTPException(404)
            return FileResponse(self.artifacts[sha])

        @app.get("/config/stream")
        async def stream(request: Request) -> StreamingResponse:
            async def events():
                sent = None
                while not await request.is_disconnected():
                    if self.snapshot is not sent:
                        sent = self.snapshot
                        yield f"event: config\ndata: {json.dumps(sent)}\n\n"
                    await asyncio.sleep(0.05)

            return StreamingResponse(events(), media_type="text/event-stream")

        return app


@contextmanager
def serve_app(app: FastAPI, health_path: str) -> Iterator[str]:
    """Serve a FastAPI app with uvicorn in a thread on a free loopback port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + health_path, timeout=10)
        yield url
    finally:
        server.should_exit = True
        thread.join(5)


@contextmanager
def running(fake: FakeControlPlane) -> Iterator[str]:
    with serve_app(fake.app, "/health") as url:
        yield url


def triton_endpoint(name: str, targets: list[dict[str, Any]], max_batch_size: int = 8) -> dict[str, Any]:
    """An endpoint entry of the snapshot, shaped as docs/architecture.md describes."""
    return {
        "name": name, "engine": "triton", "preprocess": {"kind": "none"},
        "batching": {"max_batch_size": max_batch_size, "max_queue_delay_us": 1000,
                     "preferred_batch_sizes": [4], "instances": 1},
        "targets": targets, "metrics": [], "log_freq": 1.0,
    }


def target(model: str, version: int, artifact: str, signature: dict[str, Any], weight: float = 100.0) -> dict:
    return {"model": model, "version": version, "weight": weight, "triton_name": f"{model}_v{version}",
            "artifact": artifact, "signature": signature}


