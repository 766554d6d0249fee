"""The statistics service process: events in, Prometheus metrics and drift scores out.

HTTP API (one port, ``SERVING_STATISTICS_PORT``):

* ``GET /metrics``: Prometheus exposition of every statistic.
* ``POST /events``: one batch envelope (embedded transport; see ``events.py``).
* ``PUT|GET|DELETE /references/{endpoint}/{version}/{variable}``: upload
  ``{"values": [...]}``, read, or forget a drift reference (version ``*`` = all).
* ``GET /health``: config revision seen, Kafka readiness.
* ``POST /feedback``: ``{"endpoint", "request_id", "label" | "value"}``, a worker's ground truth for a
  logged request, joined at once (ground_truth.py); worker or admin token.

``POST /events`` needs a ``worker`` or ``admin`` token and reference changes (PUT/DELETE) a
``worker``, ``deployer`` or ``admin`` one (``Authorization: Bearer``; 401 without or with a bad
one, 403 for another role): the service's own worker token (``SERVING_WORKER_TOKEN`` or
``$SERVING_HOME/tokens/worker``) is accepted as is, any other is asked of the control plane
(``GET /auth/whoami``) and the answer kept 30 s (5 s for a refusal). ``/metrics``, ``/health``
and reading a reference stay open (Prometheus scrapes them).

With ``SERVING_KAFKA_BOOTSTRAP_SERVERS`` set it also consumes ``SERVING_KAFKA_TOPIC``;
``POST /events`` keeps working, so mixed fleets never lose statistics.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from typing import Any, Callable

import httpx
import uvicorn
from fastapi import Body, FastAPI, HTTPException, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest
from starlette.concurrency import run_in_threadpool

from serving.config_client import ConfigSubscriber
from serving.credentials import worker_token
from serving.settings import StatisticsSettings
from serving.statistics.drift import DriftConfig
from serving.statistics.events import EventError
from serving.statistics.ground_truth import FeedbackError, GroundTruth
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.references import ReferenceStore
from serving.statistics.transports.kafka import KafkaBatchConsumer, KafkaOptions, ensure_topic

log = logging.getLogger(__name__)


EVENT_ROLES = frozenset({"worker", "admin"})
REFERENCE_ROLES = frozenset({"worker", "deployer", "admin"})


class IngestAuth:
    """Who may send events or change references: checked per request, answers cached briefly."""

    def __init__(self, control_plane_url: str, shared_token: Callable[[], str | None],
                 ttl_s: float = 30.0, refusal_ttl_s: float = 5.0) -> None:
        self.whoami = control_plane_url.rstrip("/") + "/auth/whoami"
        self.shared_token = shared_token
        self.ttl_s, self.refusal_ttl_s = ttl_s, refusal_ttl_s
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def role(self, token: str) -> str | None:
        shared = self.shared_token()
        if shared and hmac.compare_digest(token.encode(), shared.encode()):
            return "worker"
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            resp = httpx.get(self.whoami, headers={"Authorization": f"Bearer {token}"}, timeout=5.0)
        except httpx.HTTPError as exc:
            raise HTTPException(503, f"cannot check the token with the control plane: {exc}",
                                headers={"Retry-After": "1"}) from exc
        if resp.status_code in (401, 403, 404):
            role = None
        elif resp.status_code == 200:
            role = resp.json().get("role")
        else:
            raise HTTPException(503, f"the control plane answered {resp.status_code} checking the token",
                                headers={"Retry-After": "1"})
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + (self.ttl_s if role else self.refusal_ttl_s), role)
        return role

    def check(self, authorization: str | None, roles: frozenset[str], what: str) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, f"{what} needs 'Authorization: Bearer <token>' (a worker token)",
                                headers={"WWW-Authenticate": "Bearer"})
        role = self.role(token.strip())
        if role is None:
            raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
        if role not in roles:
            raise HTTPException(403, f"{what} needs role {' or '.join(sorted(roles))}, not {role}")


def create_app(pipeline: StatisticsPipeline, registry: CollectorRegistry,
               consumer: KafkaBatchConsumer | None = None, auth: IngestAuth | None = None) -> FastAPI:
    """``auth`` None: no token checks (an app embedded in a test or benchmark process only;
    ``run_statistics_service`` always checks)."""
    app = FastAPI(title="serving statistics")

    async def authorized(request: Request, roles: frozenset[str], what: str) -> None:
        if auth is not None:
            await run_in_threadpool(auth.check, request.headers.get("authorization"), roles, what)

    app.state.authorized = authorized

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/events")
    async def events(request: Request) -> dict[str, int]:
        await authorized(request, EVENT_ROLES, "POST /events")
        try:
            body = await request.body()
            return {"accepted": await run_in_threadpool(pipeline.handle_payload, body)}
        except EventError as exc:
            pipeline.ingested.labels("invalid").inc()
            raise HTTPException(400, str(exc)) from exc

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "revision": pipeline.revision,
                "kafka": None if consumer is None else consumer.ready.is_set()}

    _reference_routes(app, pipeline)
    _feedback_route(app, pipeline)
    return app


def _feedback_route(app: FastAPI, pipeline: StatisticsPipeline) -> None:
    @app.post("/feedback")
    async def feedback(request: Request, body: dict = Body(...)) -> dict[str, Any]:
        """A worker's ground truth for one logged request: joined at once (404 unknown, 409 labelled)."""
        await app.state.authorized(request, EVENT_ROLES, "POST /feedback")
        endpoint, request_id = body.get("endpoint"), body.get("request_id")
        if not isinstance(endpoint, str) or not isinstance(request_id, str) or not request_id:
            raise HTTPException(400, "feedback needs 'endpoint' and 'request_id' (the answer's X-Request-Id)")
        try:
            return pipeline.truth.join(endpoint, request_id, body.get("label"), body.get("value")).to_dict()
        except FeedbackError as exc:
            raise HTTPException(exc.status, str(exc)) from None


def _reference_routes(app: FastAPI, pipeline: StatisticsPipeline) -> None:
    path = "/references/{endpoint}/{version}/{variable}"

    @app.put(path)
    async def upload(request: Request, endpoint: str, version: str, variable: str,
                     body: dict = Body(...)) -> dict[str, Any]:
        await app.state.authorized(request, REFERENCE_ROLES, "changing a reference")
        return await run_in_threadpool(_upload, endpoint, version, variable, body)

    def _upload(endpoint: str, version: str, variable: str, body: dict) -> dict[str, Any]:
        values = body.get("values")
        if not isinstance(values, list) or len(values) < 2:
            raise HTTPException(422, "body must be {\"values\": [at least 2 values]}")
        try:
            ref = pipeline.upload_reference(endpoint, version, variable, values)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from exc
        return {"endpoint": endpoint, "version": version, "variable": variable, "kind": ref.kind,
                "size": len(ref.values)}

    @app.get(path)
    def read(endpoint: str, version: str, variable: str) -> dict[str, Any]:
        ref = pipeline.references.get(endpoint, version, variable) if pipeline.references else None
        if ref is None:
            raise HTTPException(404, "no stored reference")
        return {"kind": ref.kind, "values": ref.values, "uploaded": ref.uploaded}

    @app.delete(path)
    async def forget(request: Request, endpoint: str, version: str, variable: str) -> dict[str, str]:
        await app.state.authorized(request, REFERENCE_ROLES, "changing a reference")
        await run_in_threadpool(pipeline.reset_reference, endpoint, version, variable)
        return {"reset": f"{endpoint}/{version}/{variable}"}


def run_statistics_service(settings: StatisticsSettings, drift: DriftConfig = DriftConfig(),
                           kafka: KafkaOptions | None = None) -> None:
    """Run until stopped (SIGINT/SIGTERM): follow the control plane, ingest, serve /metrics."""
    disable_created_metrics()  # *_created series only double the series count
    registry = CollectorRegistry()
    state_dir = settings.home / "statistics"
    truth = GroundTruth(registry, settings.feedback_max_requests, settings.feedback_window_s)
    pipeline = StatisticsPipeline(registry, drift, ReferenceStore(state_dir / "references"), truth)
    subscriber = ConfigSubscriber(settings.control_plane_url, pipeline.apply_snapshot,
                                  cache_path=state_dir / "config.json",
                                  token=lambda: worker_token(settings)).start()
    consumer = None
    if settings.kafka_bootstrap_servers:
        kafka = kafka or KafkaOptions()
        ensure_topic(settings.kafka_bootstrap_servers, settings.kafka_topic, kafka.partitions)
        consumer = KafkaBatchConsumer(settings.kafka_bootstrap_servers, settings.kafka_topic,
                                      pipeline.handle_message, kafka).start()
    app = create_app(pipeline, registry, consumer,
                     auth=IngestAuth(settings.control_plane_url, lambda: worker_token(settings)))
    try:
        uvicorn.run(app, host=settings.statistics_host, port=settings.statistics_port, log_level="warning")
    finally:
        subscriber.stop()
        if consumer is not None:
            consumer.stop()
