"""``serving worker``: N uvicorn processes sharing one port, each a full worker.

Each process builds its own app (``factory=True``) so it has its own gRPC channel,
config subscriber and statistics recorder: nothing is shared across processes but
the listening socket. uvloop and httptools are the fast loop and HTTP parser.
"""
from __future__ import annotations

import logging
import os

from fastapi import FastAPI

from serving.settings import WorkerSettings


def create_from_env() -> FastAPI:
    from serving.worker.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return create_app(WorkerSettings())


def run_worker(settings: WorkerSettings, workers: int = 1) -> None:
    import uvicorn

    os.environ["SERVING_WORKERS"] = str(workers)  # each process sizes its onnxruntime pool from it
    uvicorn.run("serving.worker.main:create_from_env", factory=True, host=settings.worker_host,
                port=settings.worker_port, workers=workers, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, timeout_graceful_shutdown=2)
