"""Control-plane HTTP API over the registry, plus the SSE config stream workers follow."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.orm.exc import StaleDataError

from registry import audit, auth, client_keys, config_notify, schemas
from registry.artifacts import ArtifactStore
from registry.broadcast import Broadcaster
from registry.console.app import mount_console
from registry.db import make_engine, session_factory, upgrade
from registry.leadership import Leadership
from registry.orm import Endpoint, ModelVersion
from registry.readiness import ReadinessBook, readiness_router
from registry.rollout_api import rollout_router
from registry.rollout_metrics import MetricsSource, PrometheusSource, StatisticsServiceSource
from registry.rollouts import RolloutController, Rollouts
from registry.schemas import LLM_ENGINES, MAX_VERSION
from registry.service import NotFound, Registry, RegistryError
from registry.signature import SignatureError
from serving.llm.naming import served_by
from serving.settings import ControlPlaneSettings

log = logging.getLogger(__name__)


def model_out(m: ModelVersion) -> dict:
    return {
        "id": m.id, "name": m.name, "version": m.version, "framework": m.framework, "sha256": m.sha256,
        "size": m.size, "signature": m.signature, "tags": m.tags, "metadata": m.meta,
        "created_at": m.created_at.isoformat(),
    }


def endpoint_out(ep: Endpoint) -> dict:
    return {
        "name": ep.name, "engine": ep.engine, "preprocess": ep.preprocess, "batching": ep.batching,
        "log_freq": ep.log_freq, "io": ep.io or {}, "auto_update": ep.auto_update or {},
        "engine_options": ep.engine_options or {}, "prediction_log": ep.prediction_log,
        "targets": [{"model": t.model.name, "version": t.model.version, "weight": t.weight, "role": t.role,
                     **({"served_by": served_by(t.model.name, t.model.version, ep.engine_options, t.model.signature)}
                        if ep.engine in LLM_ENGINES else {})}
                    for t in ep.targets],
        "metrics": [{"name": m.name, "kind": m.kind, **m.spec} for m in ep.metrics],
    }


def create_app(settings: ControlPlaneSettings | None = None) -> FastAPI:
    settings = settings or ControlPlaneSettings()
    url = settings.resolved_database_url()
    engine = make_engine(url)
    upgrade(engine)
    sessions = session_factory(engine)
    store = ArtifactStore(settings.resolved_artifact_dir())
    # of several replicas on one database, only the leader runs rollouts and the listeners (docs/high-availability.md)
    leadership = Leadership(url)
    broadcaster = Broadcaster(sessions, listeners=_listeners(settings, store), leads=lambda: leadership.is_leader)
    notify = config_notify.uses_notify(url)  # PostgreSQL: each change is announced to the other replicas
    # writes commit on many threads at once; each refresh reads after the commit that called it
    registry = Registry(sessions, store, on_change=broadcaster.refresh,
                        announce=config_notify.announce if notify else lambda s: None,
                        external_triton=settings.triton_model_repository is not None,
                        per_model_installs=settings.install_py_dep_per_model)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        broadcaster.start(asyncio.get_running_loop())
        listener = config_notify.ConfigListener(url, broadcaster.refresh_to).start() if notify else None
        watcher = asyncio.create_task(broadcaster.watch_database(config_notify.SAFETY_NET_POLL_S if notify else 1.0))
        leadership.on_gain.append(broadcaster.replay)
        leadership.start()
        controller = RolloutController(rollouts, settings.rollout_tick_s, leads=lambda: leadership.is_leader).start()
        yield
        leadership.stop()  # first: another replica leads within its period, while this one finishes stopping
        controller.stop()
        if listener is not None:
            listener.stop()
        watcher.cancel()
        engine.dispose()

    rollouts = Rollouts(registry, _rollout_metrics(settings))
    app = FastAPI(title="serving control plane", lifespan=lifespan)
    app.state.registry, app.state.broadcaster, app.state.leadership = registry, broadcaster, leadership
    app.state.db_sessions = sessions  # the console's sign-in sessions live in the same database
    _errors(app)
    auth.install(app, sessions, settings)  # before any route: each one added after checks a token
    audit.install(app, sessions)
    app.state.max_artifact_bytes = settings.max_artifact_bytes
    app.state.readiness = ReadinessBook(sessions)
    app.include_router(readiness_router(app.state.readiness, lambda: broadcaster.snapshot))  # before /endpoints/{name}
    _routes(app, registry, broadcaster, store, leadership)
    client_keys.install(app, registry)
    app.include_router(rollout_router(rollouts))
    mount_console(app, settings)  # /console: the web console (registry/console/, docs/console.md)
    return app


def _rollout_metrics(settings: ControlPlaneSettings) -> MetricsSource:
    if settings.prometheus_url:
        return PrometheusSource(settings.prometheus_url)
    return StatisticsServiceSource(settings.resolved_statistics_url())


def _listeners(settings: ControlPlaneSettings, store: ArtifactStore) -> list:
    """When an external Triton is configured, keep its model repository in step."""
    if settings.triton_model_repository is None:
        return []
    from serving.triton.repository import RepositorySync

    sync = RepositorySync(settings.triton_model_repository, store.path, settings.triton_control_url)
    return [sync.apply]


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RegistryError)
    async def registry_error(_req: Request, exc: RegistryError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(SignatureError)
    async def signature_error(_req: Request, exc: SignatureError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req: Request, exc: RequestValidationError):
        # FastAPI's own handler echoes the input, and a NaN in it cannot be written as JSON (a 500).
        # (and a validator's message is said as it is, without pydantic's "Value error, " in front)
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")).removeprefix("Value error, "),
                   "type": e.get("type")} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(IntegrityError)
    @app.exception_handler(StaleDataError)
    async def conflict(_req: Request, exc: Exception):
        log.warning("write conflict: %s", exc)
        return JSONResponse({"detail": "the change conflicts with a concurrent change; "
                                       "read the current state and try again"}, status_code=409)

    @app.exception_handler(DataError)
    async def bad_data(_req: Request, exc: DataError):
        return JSONResponse({"detail": f"the database refused a value: {str(exc.orig).splitlines()[0]}"},
                            status_code=422)

    @app.exception_handler(OperationalError)
    async def database_unavailable(_req: Request, exc: OperationalError):
        log.warning("database unavailable: %s", exc)
        return JSONResponse({"detail": "the registry database is busy or unreachable; try again"},
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def unexpected(_req: Request, exc: Exception):
        log.exception("unexpected control-plane error")
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)


def _routes(app: FastAPI, registry: Registry, broadcaster: Broadcaster, store: ArtifactStore,
            leadership: Leadership) -> None:
    @app.get("/health")
    def health():
        return {"status": "ok", "revision": registry.revision(), "leader": leadership.is_leader}

    @app.get("/leadership")
    def leadership_state():
        """Whether this replica leads (open: the LLM launcher sidecar asks it on 127.0.0.1 before acting)."""
        return leadership.state()

    @app.get("/config")
    def config():
        return broadcaster.snapshot

    @app.get("/config/stream")
    async def config_stream():
        return StreamingResponse(broadcaster.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/artifacts", status_code=201)
    async def upload(request: Request):
        sha, size = await auth.receive_upload(request, store)
        return {"sha256": sha, "size": size}

    @app.get("/artifacts/{sha256}")
    def download(sha256: str):
        if not store.exists(sha256):
            raise NotFound(f"artifact {sha256} not found")
        return FileResponse(store.path(sha256), media_type="application/octet-stream")

    @app.post("/models", status_code=201)
    def add_model(req: schemas.ModelCreate):
        model = registry.add_model(req)
        skipped = registry.follow_new_version(model.name)
        not_followed = [{"endpoint": name, "reason": k["reason"]} for name, ks in skipped.items()
                        for k in ks if k["version"] == model.version]  # auto-update endpoints that cannot run it
        return {**model_out(model), **({"not_followed": not_followed} if not_followed else {})}

    @app.get("/models")
    def list_models(name: str | None = None):
        return [model_out(m) for m in registry.list_models(name)]

    @app.delete("/models/{name:path}")  # names may hold any printable character, '/' (sent as %2F) too
    def remove_model(name: str, version: int | None = Query(None, ge=1, le=MAX_VERSION)):
        return {"removed": registry.remove_model(name, version)}

    @app.post("/endpoints", status_code=201)
    def deploy(req: schemas.EndpointDeploy):
        return endpoint_out(registry.deploy(req))

    @app.get("/endpoints")
    def list_endpoints():
        ready = app.state.readiness.summary(broadcaster.snapshot)  # where each answers (registry/readiness.py)
        return [{**endpoint_out(e), "readiness": ready.get(e.name)} for e in registry.list_endpoints()]

    @app.get("/endpoints/{name}")
    def get_endpoint(name: str):
        return endpoint_out(registry.get_endpoint(name))

    @app.delete("/endpoints/{name}")
    def remove_endpoint(name: str):
        registry.remove_endpoint(name)
        return {"removed": name}

    @app.put("/endpoints/{name}/weights")
    def set_weights(name: str, req: schemas.CanaryWeights):
        return endpoint_out(registry.set_weights(name, req))

    @app.put("/endpoints/{name}/newest-weights")
    def set_newest_weights(name: str, req: schemas.NewestWeights):
        return endpoint_out(registry.set_newest_weights(name, req))

    @app.post("/endpoints/{name}/promote")
    def promote(name: str):
        return endpoint_out(registry.promote(name))

    @app.post("/endpoints/{name}/rollback")
    def rollback(name: str):
        return endpoint_out(registry.rollback(name))

    @app.delete("/endpoints/{name}/shadow")
    def remove_shadow(name: str):
        return endpoint_out(registry.remove_shadow(name))

    @app.put("/endpoints/{name}/log-freq")
    def log_freq(name: str, req: schemas.LogFreq):
        registry.set_log_freq(name, req.log_freq)
        return {"endpoint": name, "log_freq": req.log_freq}

    @app.put("/endpoints/{name}/prediction-log")
    def prediction_log(name: str, req: schemas.PredictionLog):
        """What the prediction log keeps of the endpoint's requests (docs/prediction-log.md); audited."""
        settings = req.stored()
        registry.set_prediction_log(name, settings)
        return {"endpoint": name, "prediction_log": settings}

    @app.post("/endpoints/{name}/metrics", status_code=201)
    def add_metric(name: str, req: schemas.MetricCreate):
        registry.add_metric(name, req)
        return endpoint_out(registry.get_endpoint(name))

    @app.delete("/endpoints/{name}/metrics/{metric}")
    def remove_metric(name: str, metric: str):
        registry.remove_metric(name, metric)
        return {"removed": metric}
