"""The statistics service process: events in, Prometheus metrics and drift scores out.

HTTP API (one port, ``SERVING_STATISTICS_PORT``):

* ``GET /metrics``: Prometheus exposition of every statistic.
* ``POST /events``: one batch envelope (embedded transport; see ``events.py``).
* ``PUT|GET|DELETE /references/{endpoint}/{version}/{variable}``: upload
  ``{"values": [...]}``, read, or forget a drift reference (version ``*`` = all).
* ``GET /health``: config revision seen, Kafka readiness.

With ``SERVING_KAFKA_BOOTSTRAP_SERVERS`` set it also consumes ``SERVING_KAFKA_TOPIC``;
``POST /events`` keeps working, so mixed fleets never lose statistics.
"""
from __future__ import annotations

import logging
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, HTTPException, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest
from starlette.concurrency import run_in_threadpool

from serving.config_client import ConfigSubscriber
from serving.settings import StatisticsSettings
from serving.statistics.drift import DriftConfig
from serving.statistics.events import EventError
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.references import ReferenceStore
from serving.statistics.transports.kafka import KafkaBatchConsumer, KafkaOptions, ensure_topic

log = logging.getLogger(__name__)


def create_app(pipeline: StatisticsPipeline, registry: CollectorRegistry,
               consumer: KafkaBatchConsumer | None = None) -> FastAPI:
    app = FastAPI(title="serving statistics")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/events")
    async def events(request: Request) -> dict[str, int]:
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
    return app


def _reference_routes(app: FastAPI, pipeline: StatisticsPipeline) -> None:
    path = "/references/{endpoint}/{version}/{variable}"

    @app.put(path)
    def upload(endpoint: str, version: str, variable: str, body: dict = Body(...)) -> dict[str, Any]:
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
    def forget(endpoint: str, version: str, variable: str) -> dict[str, str]:
        pipeline.reset_reference(endpoint, version, variable)
        return {"reset": f"{endpoint}/{version}/{variable}"}


def run_statistics_service(settings: StatisticsSettings, drift: DriftConfig = DriftConfig(),
                           kafka: KafkaOptions | None = None) -> None:
    """Run until stopped (SIGINT/SIGTERM): follow the control plane, ingest, serve /metrics."""
    disable_created_metrics()  # *_created series only double the series count
    registry = CollectorRegistry()
    state_dir = settings.home / "statistics"
    pipeline = StatisticsPipeline(registry, drift, ReferenceStore(state_dir / "references"))
    subscriber = ConfigSubscriber(settings.control_plane_url, pipeline.apply_snapshot,
                                  cache_path=state_dir / "config.json").start()
    consumer = None
    if settings.kafka_bootstrap_servers:
        kafka = kafka or KafkaOptions()
        ensure_topic(settings.kafka_bootstrap_servers, settings.kafka_topic, kafka.partitions)
        consumer = KafkaBatchConsumer(settings.kafka_bootstrap_servers, settings.kafka_topic,
                                      pipeline.handle_message, kafka).start()
    app = create_app(pipeline, registry, consumer)
    try:
        uvicorn.run(app, host=settings.statistics_host, port=settings.statistics_port, log_level="warning")
    finally:
        subscriber.stop()
        if consumer is not None:
            consumer.stop()
