"""``serving worker``: N processes on one HTTP port and one gRPC port, each a full worker.

Each process builds its own app (``factory=True``) so it has its own Triton channel,
config subscriber and statistics recorder, and serves HTTP (uvicorn; uvloop and httptools are
the fast loop and parser) and the v2 gRPC service on one event loop. With several processes the
manager hands each new connection to the process holding the fewest (handoff.py, listeners.py).
"""
from __future__ import annotations

import gc
import logging
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI

from serving.settings import WorkerSettings

GIL_SWITCH_INTERVAL_S = 0.001
# uvicorn's manager kills a process that does not answer its ping in time as hung. Its default of
# 5 s killed processes still loading their models on a loaded machine (2 cores, load 20), over and
# over; a process really hung is still replaced within half a minute.
HEALTHCHECK_TIMEOUT_S = 30


def create_from_env() -> FastAPI:
    # An onnxruntime thread that finishes an inference needs the GIL back to hand over its
    # result; under load the event loop holds it, and Python's default 5 ms switch interval
    # leaves that core idle meanwhile (about 7% of W2's throughput, benchmarks/profile.py).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    from serving.worker.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = WorkerSettings()
    app = create_app(settings)
    if settings.worker_grpc_port:
        serve_grpc_too(app, settings)
    freeze_heap()
    app.state.dataplane.config.listeners.append(lambda _snapshot: freeze_heap())  # models, user code
    return app


def serve_grpc_too(app: FastAPI, settings: WorkerSettings) -> None:
    """The gRPC server lives as long as the app, after its config and engines are up; a port it
    cannot bind fails the process's start-up, which stops ``serving worker`` with the reason."""
    from serving.worker import handoff
    from serving.worker.frontends.grpc_service import start_grpc_server

    app_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[None]:
        async with app_lifespan(app_):
            server = await start_grpc_server(app.state.dataplane, settings.worker_host, settings.worker_grpc_port,
                                             settings.max_body_bytes, unix_name=handoff.PROCESS_GRPC_NAME,
                                             max_connection_age_s=settings.worker_max_connection_age_s)
            try:
                yield
            finally:
                await server.stop(grace=2)

    app.router.lifespan_context = lifespan


def freeze_heap() -> None:
    """What is loaded by now (modules, models, user code) lives as long as the process or the
    config; left to the collector, each full collection walks all of it and stops every request
    meanwhile: the W0 echo's p99 went from 46-56 ms to 12.5-39 ms without those pauses
    (docs/benchmarks.md). Called at start and after each config is applied (a cheap collection
    then: the frozen heap is no longer walked)."""
    gc.collect()
    gc.freeze()


def install_extra_packages(settings: WorkerSettings) -> None:
    """``SERVING_EXTRA_PYTHON_PACKAGES`` (ClearML's ``CLEARML_EXTRA_PYTHON_PACKAGES``): pip requirements the
    users' preprocess code imports, installed before any worker process starts. They go under
    ``SERVING_HOME/packages`` (the image runs as a non-root user and its environment is read-only;
    a volume there keeps them across restarts) and onto every process's path."""
    import os
    import shlex

    from preprocess.requirements import ensure_installed

    packages = shlex.split(settings.extra_python_packages)
    if packages:
        print(f"installing extra Python packages: {' '.join(packages)}", file=sys.stderr, flush=True)
        target = ensure_installed(packages, settings.home / "packages")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)


def run_worker(settings: WorkerSettings, workers: int = 1) -> None:
    """uvicorn's process manager even for one process: it starts a new worker process when one dies,
    so a killed worker costs only its connections (listeners.py); one process's socket is held by
    the manager meanwhile, so new connections wait in its backlog instead of being refused."""
    import uvicorn

    from serving.worker.listeners import ReusePortProcesses, ensure_free

    install_extra_packages(settings)
    host, port = settings.worker_host, settings.worker_port
    ensure_free(host, port, "SERVING_WORKER_PORT or --port")
    if settings.worker_grpc_port:
        ensure_free(host, settings.worker_grpc_port, "SERVING_WORKER_GRPC_PORT (0 turns gRPC off)")
    config = uvicorn.Config("serving.worker.main:create_from_env", factory=True, host=host, port=port,
                            workers=max(1, workers), loop="uvloop", http="httptools",
                            log_level="warning", access_log=False,
                            timeout_graceful_shutdown=settings.worker_graceful_stop_s,
                            timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT_S)
    ReusePortProcesses(config, max(1, workers), settings.worker_grpc_port, settings.worker_balance).run()
