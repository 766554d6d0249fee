"""``serving worker``: N uvicorn processes sharing one port, each a full worker.

Each process builds its own app (``factory=True``) so it has its own gRPC channel,
config subscriber and statistics recorder: nothing is shared across processes but
the listening socket. uvloop and httptools are the fast loop and HTTP parser.
"""
from __future__ import annotations

import logging
import sys

from fastapi import FastAPI

from serving.settings import WorkerSettings

GIL_SWITCH_INTERVAL_S = 0.001


def create_from_env() -> FastAPI:
    # An onnxruntime thread that finishes an inference needs the GIL back to hand over its
    # result; under load the event loop holds it, and Python's default 5 ms switch interval
    # leaves that core idle meanwhile (about 7% of W2's throughput, benchmarks/profile.py).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    from serving.worker.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return create_app(WorkerSettings())


def run_worker(settings: WorkerSettings, workers: int = 1) -> None:
    import uvicorn

    uvicorn.run("serving.worker.main:create_from_env", factory=True, host=settings.worker_host,
                port=settings.worker_port, workers=workers, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, timeout_graceful_shutdown=2)
