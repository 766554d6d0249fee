"""The worker's FastAPI app: wires config sync, engines, recorder and the front ends together.

``create_app(settings, snapshot=...)`` serves a fixed snapshot with no control
plane (in-process tests); without it the app follows the control plane and
starts from its local cache.
"""
from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.artifact_client import ArtifactFetcher
from serving.readiness_report import ReadinessReporter, process_id
from serving.settings import WorkerSettings
from serving.worker.config_sync import ConfigSync
from serving.worker.dataplane import DataPlane, Recorder
from serving.worker.engines.registry import build_engines
from serving.worker.errors import ServingError, UnknownEndpoint
from serving.worker.frontends.body import json_response
from serving.worker.frontends.serve_rest import ServeRoute, error_response, match_serve_path, openapi_paths
from serving.llm.engines.hold_metrics import HOLD_STATS, collector as held_collector
from serving.llm.openai.frontend import openai_router
from serving.embeddings.tei import tei_router
from serving.worker.frontends.torchserve import torchserve_router
from serving.worker.frontends.v2 import v2_router
from serving.llm.relay.generation import Generation
from serving.worker.pipeline import RequestSender
from serving.tracing import spans
from serving.worker.request_ids import RequestIds
from serving.worker.tracing_layer import TracingLayer
from serving.worker.connection_age import ConnectionAge
from serving.worker.load import metrics_text
from serving.worker.stats_exchange import StatsExchange, group

log = logging.getLogger(__name__)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServingError)
    async def serving_error(request: Request, exc: ServingError) -> Response:
        if isinstance(exc, UnknownEndpoint) and request.url.path.startswith("/v2/"):
            exc = exc.as_triton()  # in Triton's words on its protocol
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return json_response({"error": problems}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown routes and methods answer the platform's error body, as every other error does."""
        status, message, headers = _routing_error(request, exc)
        return json_response({"error": message}, status_code=status, headers=headers)


def _routing_error(request: Request, exc: StarletteHTTPException) -> tuple[int, str, dict[str, str]]:
    method, path = request.method, request.url.path
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        return 405, f"method {method} is not allowed on {path} (allowed: {headers.get('Allow', 'none')})", headers
    if exc.status_code == 404 and exc.detail == "Not Found":
        if match_serve_path(path) is not None:  # ServeRoute takes POST only; anything else falls through here
            return 405, f"method {method} is not allowed on {path} (allowed: POST)", {"Allow": "POST"}
        return 404, (f"no route {method} {path}; the worker serves POST /serve/{{endpoint}}[/{{version}}], "
                     "the v2 protocol under /v2/, the OpenAI API under /serve/openai/v1/, TEI's under "
                     "/serve/tei/{endpoint}/, TorchServe's /predictions/{name} and GET /status"), headers
    return exc.status_code, str(exc.detail), headers


class LastResort:
    """The handler of last resort, an ASGI layer just inside Starlette's ServerErrorMiddleware.

    A bug must cost one request, not the connection: Starlette's own 500 path re-raises after
    answering, and the server then drops the connection without saying so, so a keep-alive
    client's next request gets nothing. Here the exception stops: a one-line JSON 500 with
    ``Connection: close`` (the request body may be half read), the traceback in the log, and a
    count in ``/status`` (``internal_errors``).
    """

    def __init__(self, app: Any, counts: dict[str, int]) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            self.counts["internal_errors"] = self.counts.get("internal_errors", 0) + 1
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for a status: the server closes the connection
                raise
            body = orjson.dumps({"error": f"internal error ({type(exc).__name__}); see the worker log"})
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})


def _document_serve_paths(app: FastAPI) -> None:
    """The OpenAPI document: FastAPI's routes plus ServeRoute's paths (serve_rest.openapi_paths)."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema["paths"] = {**openapi_paths(), **schema.get("paths", {})}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _start_recorder(settings: WorkerSettings, sync: ConfigSync) -> Any:
    from serving.statistics.recorder import recorder_from_settings

    recorder = recorder_from_settings(settings, follow_config=False)
    sync.listeners.append(recorder.apply_snapshot)
    return recorder


def _start_prediction_log(settings: WorkerSettings, dataplane: DataPlane) -> Any:
    """The prediction log's writer and sink (serving/prediction_log/); its counts go out as statistics."""
    from serving.prediction_log.sinks import SINKS
    from serving.prediction_log.writer import PredictionLog, WriterConfig
    from serving.statistics.recorder import default_source

    if settings.prediction_log_sink == "off":
        return None

    def report(endpoint: str, written: int, dropped: int) -> None:
        if dataplane.recorder is not None:
            dataplane.recorder.record({"endpoint": endpoint, "version": None,
                                       "prediction_log": {"written": written, "dropped": dropped}})

    sink = SINKS[settings.prediction_log_sink](settings, default_source())
    writer = PredictionLog(sink, WriterConfig(max_queue=settings.prediction_log_max_queue), report=report)
    dataplane.predictions.log = writer
    return writer


def _refuse(path: str, exc: ServingError) -> Response:
    """An error before any front end ran (a malformed traceparent), in the shape of the one the path is for."""
    from serving.embeddings.tei import tei_error
    from serving.llm.openai.frontend import openai_error
    from serving.worker.frontends.torchserve import ts_error

    if path.startswith("/serve/openai/"):
        return openai_error(exc)
    if path.startswith("/serve/tei/"):
        return tei_error(exc)
    if path.startswith(("/predictions/", "/explanations/", "/ping")):
        return ts_error(exc)
    return error_response(exc)


def _feedback_client(settings: WorkerSettings, predictions: Any) -> Any:
    """Ground truth goes to the statistics service, which joins it (serving/worker/feedback.py)."""
    from serving.credentials import worker_token
    from serving.statistics.recorder import statistics_url
    from serving.worker.feedback import FeedbackClient

    client = FeedbackClient(statistics_url(settings) if settings.statistics_enabled else None,
                            lambda: worker_token(settings))
    client.log = predictions
    return client


def create_app(settings: WorkerSettings | None = None, snapshot: dict | None = None,
               recorder: Recorder | None = None) -> FastAPI:
    settings = settings or WorkerSettings()
    fetcher = ArtifactFetcher(settings.control_plane_url, settings.home / "cache", settings.resolved_artifact_dir())
    engines = build_engines(settings, fetcher.path)
    sender = RequestSender(settings.resolved_pipeline_url(), settings.user_code_timeout_s)
    sync = ConfigSync(engines, fetcher.path, settings.home / "cache" / "unpacked", sender=sender,
                      user_timeout_s=settings.user_code_timeout_s)
    dataplane = sender.dataplane = DataPlane(sync, engines, recorder)
    dataplane.keys.required = settings.client_keys_required
    generation = sender.generation = Generation(dataplane)  # LLM endpoints' path (OpenAI front end, send_request)
    sync.listeners.insert(0, dataplane.keys.apply_snapshot)  # the keys of each pushed config, first

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = None
        sender.loop = asyncio.get_running_loop()
        spans.configure(settings.tracing_otlp_endpoint, settings.tracing_sample, "serving-worker")
        if dataplane.recorder is None and settings.statistics_enabled:
            owned = dataplane.recorder = _start_recorder(settings, sync)
        sync.recorder = dataplane.recorder  # load outcomes (failed, ready, retired) go with the requests' events
        predictions = _start_prediction_log(settings, dataplane)
        dataplane.feedback_client = _feedback_client(settings, predictions)
        exchange = StatsExchange(lambda: {"versions": dataplane.version_stats.rows(),  # the worker's processes'
                                          "in_flight": dataplane.in_flight.value,  # statistics and load
                                          "llm_hold": HOLD_STATS.snapshot()}, group())  # held LLM requests
        await exchange.start()
        dataplane.version_stats.exchange = dataplane.in_flight.exchange = exchange
        reporter = None
        if snapshot is not None:
            sync.apply(snapshot)
        else:  # readiness reports to the control plane (serving/readiness_report.py)
            reporter = ReadinessReporter(settings.control_plane_url, process_id("worker"), sync.readiness).start()
            sync.watchers.append(reporter.poke)
            sync.follow(settings.control_plane_url, settings.resolved_cache())
        yield
        if reporter is not None:
            reporter.stop()
        sync.stop()
        await asyncio.to_thread(sync.close_processors)  # user code's unload(): blocking, off the loop
        await exchange.stop()
        for engine in engines.values():
            await engine.close()
        await dataplane.feedback_client.close()
        if predictions is not None:  # its last counts go out with the recorder, closed next
            await asyncio.to_thread(predictions.close)
        if owned is not None:
            owned.close()
        await asyncio.to_thread(spans.shutdown)  # the spans still buffered go out

    app = FastAPI(title="serving worker", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.dataplane = dataplane
    _error_handlers(app)
    counts: dict[str, int] = {"internal_errors": 0}
    app.add_middleware(ServeRoute, dataplane=dataplane, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(LastResort, counts=counts)  # outside ServeRoute
    app.add_middleware(TracingLayer, refuse=_refuse)  # traceparent checked, the request's span, ids in error bodies
    if settings.worker_max_connection_age_s > 0:  # old connections closed after an answer; off: not on the path
        app.add_middleware(ConnectionAge, max_age_s=settings.worker_max_connection_age_s)
    app.add_middleware(RequestIds)  # added last: outermost, so every answer has its X-Request-Id
    _document_serve_paths(app)  # served by ServeRoute, described from the same templates
    app.include_router(v2_router(dataplane, settings.max_body_bytes))
    app.include_router(openai_router(generation, settings.max_body_bytes))
    app.include_router(tei_router(dataplane, settings.max_body_bytes))  # /serve/tei/{endpoint}/...
    app.include_router(torchserve_router(dataplane, settings.max_body_bytes))  # /predictions, /ping (TorchServe's)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:  # the worker's load: requests in flight (load.py), read for autoscaling
        return Response(await metrics_text(dataplane.in_flight, held_collector), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status")
    def status() -> dict:
        config = sync.current
        return {"revision": config.revision, "pid": os.getpid(), "errors": dict(config.errors),
                "grpc_port": settings.worker_grpc_port,
                "readiness": sync.readiness()["endpoints"],
                "internal_errors": counts["internal_errors"],
                "prediction_log": dataplane.predictions.log.status() if dataplane.predictions.log else None,
                "endpoints": {n: {"engine": ep.engine, "preprocess": ep.preprocess_kind,
                                  "versions": [{"version": t.version, "weight": t.weight} for t in ep.targets]}
                              for n, ep in config.endpoints.items()}}

    return app
