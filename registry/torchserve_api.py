"""TorchServe's management API, served by the control plane on a port of its own.

A TorchServe user's deploy job calls ``POST /models?url=...``, ``PUT .../set-default``, ``DELETE ...``
on port 8081; pointed here (``SERVING_TORCHSERVE_MANAGEMENT_PORT``, bound to the control plane's host)
with one of our API tokens as TorchServe's bearer token, it works unchanged. It is an app apart from
the control plane's own, because ``/models`` means the registry's model versions there; both share
one Registry (the same database, revisions and config stream), run in one process on one event loop
(serving/asgi_servers.py), and every change lands in the same audit log, its action marked
``torchserve:``. What each call does in the registry: registry/torchserve_changes.py; how models and
versions map: registry/torchserve_models.py; docs/torchserve.md#the-management-api.

Answers and errors are TorchServe's shapes (``{"status": ...}``, ``{"code", "type", "message"}``);
reading needs a reader's token, changes a deployer's (what deploying needs on our own API).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm.exc import StaleDataError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry import audit
from registry.auth import CHANGERS, PRINCIPAL_KEY, READ_METHODS, READERS, bearer, principal_of
from registry.errors import NotFound, RegistryError
from registry.readiness import POLL_S
from registry.schemas import endpoint_name
from registry.signature import SignatureError
from registry.torchserve_changes import Registration, TorchServeModels
from registry.torchserve_fetch import Limits, charge, fetch, shown_url
from registry.torchserve_models import (
    ManagementError, WorkerLine, bad_request, describe, find_target, list_page, live_targets,
)
from registry.torchserve_params import (
    check_archive_overrides, flag, register_options, register_params, scale_workers, startup_timeout, whole,
)
from serving.settings import ControlPlaneSettings
from serving.torchserve.archive import ArchiveError, ArchiveInfo, read_archive
from serving.torchserve.options import effective

log = logging.getLogger(__name__)

AUDIT_PREFIX = "torchserve:"  # audit actions: "POST torchserve:/models", beside our own "POST /models"
PROCESSING = {"status": "Processing worker updates..."}  # TorchServe's answer to a change not waited for
# our errors' statuses -> TorchServe's exception names (a 422 of ours is TorchServe's 400)
ERROR_TYPES = {400: "BadRequestException", 401: "InvalidKeyException", 403: "InvalidKeyException",
               404: "ModelNotFoundException", 405: "MethodNotAllowedException", 408: "RequestTimeoutException",
               409: "ConflictStatusException", 503: "ServiceUnavailableException"}


def create_management_app(main: FastAPI, settings: ControlPlaneSettings) -> FastAPI:
    """The management API over the control plane ``main``'s registry, tokens and readiness reports."""
    app = FastAPI(title="TorchServe management API (serving control plane)", docs_url=None, redoc_url=None,
                  openapi_url=None)
    _errors(app)
    tokens = main.state.tokens

    def authorize(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if creds is None or not creds.credentials:
            raise ManagementError(401, "InvalidKeyException", "authentication required: send 'Authorization: Bearer "
                                  "<token>' with an API token of the control plane", {"WWW-Authenticate": "Bearer"})
        principal = tokens.lookup(creds.credentials)
        if principal is None:
            raise ManagementError(401, "InvalidKeyException", "invalid or revoked token", {"WWW-Authenticate": "Bearer"})
        request.scope[PRINCIPAL_KEY] = principal  # the audit log's actor
        roles = READERS if request.method in READ_METHODS else CHANGERS
        if principal.role not in roles:
            raise ManagementError(403, "InvalidKeyException", f"token {principal.name} has role {principal.role}; "
                                  f"{request.method} needs role {' or '.join(sorted(roles))}")

    app.router.dependencies.append(Depends(authorize))
    audit.install(app, main.state.registry.sessions, prefix=AUDIT_PREFIX)
    _routes(app, main, settings, TorchServeModels(main.state.registry))
    return app


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "type": kind, "message": message}, status_code=status, headers=headers)


def _errors(app: FastAPI) -> None:
    """Every answer that is not a success in TorchServe's shape; nothing escapes as a bare 500."""
    @app.exception_handler(ManagementError)
    async def management(_req: Request, exc: ManagementError):
        return _error(exc.status, exc.kind, exc.message, exc.headers)

    @app.exception_handler(RegistryError)
    async def registry_error(_req: Request, exc: RegistryError):
        status = 400 if exc.status in (413, 422) else exc.status
        return _error(status, ERROR_TYPES.get(status, "InternalServerException"), exc.message, exc.headers)

    @app.exception_handler(SignatureError)
    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def invalid(_req: Request, exc: Exception):
        return _error(400, "BadRequestException", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req: Request, exc: StarletteHTTPException):
        kind = {404: "ResourceNotFoundException", 405: "MethodNotAllowedException"}.get(exc.status_code)
        return _error(exc.status_code, kind or ERROR_TYPES.get(exc.status_code, "BadRequestException"), str(exc.detail))

    @app.exception_handler(IntegrityError)
    @app.exception_handler(StaleDataError)
    async def conflict(_req: Request, exc: Exception):
        log.warning("write conflict: %s", exc)
        return _error(409, "ConflictStatusException", "the change conflicts with a concurrent change; try again")

    @app.exception_handler(OperationalError)
    async def unavailable(_req: Request, exc: OperationalError):
        log.warning("database unavailable: %s", exc)
        return _error(503, "ServiceUnavailableException", "the registry database is busy or unreachable; try again",
                      {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def unexpected(_req: Request, exc: Exception):
        log.exception("unexpected error in TorchServe's management API")
        return _error(500, "InternalServerException", f"internal error: {type(exc).__name__}")


def _routes(app: FastAPI, main: FastAPI, settings: ControlPlaneSettings, models: TorchServeModels) -> None:
    registry, book, broadcaster = main.state.registry, main.state.readiness, main.state.broadcaster
    model_store = settings.resolved_torchserve_model_store()

    def status_of(name: str) -> dict[str, Any]:
        try:
            return book.endpoint_status(name, broadcaster.snapshot)
        except NotFound:  # removed meanwhile, or not yet in the snapshot
            return {"state": "unknown", "error": None, "workers": []}

    def worker_lines(name: str) -> list[WorkerLine]:
        return [WorkerLine.from_status(line) for line in status_of(name)["workers"]]

    async def settled(name: str, timeout_s: float) -> dict[str, Any]:
        """The endpoint's readiness once ready or failed, or as it is when ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        while True:  # the reports are read from the database: off the event loop
            status = await run_in_threadpool(status_of, name)
            if status["state"] in ("ready", "failed") or time.monotonic() >= deadline:
                return status
            await asyncio.sleep(POLL_S)

    def not_ready(what: str, status: dict[str, Any], timeout_s: float, name: str) -> ManagementError:
        why = ("no worker process reports to the control plane (is a worker running?)" if status["state"] == "unknown"
               else f"state {status['state']}")
        return ManagementError(408, "RequestTimeoutException",
                               f"{what}, but its workers were not ready within {timeout_s:g} s ({why}); they go on "
                               f"loading: GET /models/{name}/all shows them")

    @app.get("/models")
    def list_models(request: Request):
        params = request.query_params
        return list_page(models.endpoints(), whole(params, "limit", 100), whole(params, "next_page_token", 0))

    @app.post("/models")
    async def register(request: Request):
        params = await register_params(request)
        url = params.get("url")
        if not url:
            raise bad_request("Parameter url is required.")
        options, wait_s = register_options(params), startup_timeout(params)
        principal = principal_of(request)
        limits = Limits.of(main.state.max_artifact_bytes, principal)
        fetched = await fetch(url, registry.store, model_store, limits)
        info = await run_in_threadpool(_archive_info, registry.store.path(fetched.sha256), url)
        check_archive_overrides(params, info)
        name = _model_name(params.get("model_name") or info.model_name)
        request.scope[audit.TARGET_KEY] = name
        await charge(main.state.tokens, principal, fetched, limits)
        done = await run_in_threadpool(models.register, name, fetched.sha256, shown_url(url), info, options)
        workers = effective(info, (await run_in_threadpool(models.endpoint, name)).engine_options or {})["workers"]
        registered = f'Model "{name}" Version: {done.label} registered with {workers} initial workers'
        if not flag(params, "synchronous"):
            return JSONResponse(PROCESSING, 202) if "workers" in options else {"status": registered + " (loading)"}
        status = await settled(name, wait_s)
        if status["state"] == "failed":
            await run_in_threadpool(models.undo, done)
            raise bad_request(f"the workers could not load {_named(done)}: {status['error']}; the registration "
                              "was undone")
        if status["state"] != "ready":
            raise not_ready(f'Model "{name}" Version: {done.label} is registered', status, wait_s, name)
        return {"status": registered}

    @app.get("/models/{model_name}")
    def describe_default(model_name: str):
        ep = models.endpoint(model_name)
        return [describe(ep, find_target(ep, None), worker_lines(model_name))]

    @app.get("/models/{model_name}/{version}")
    def describe_version(model_name: str, version: str):
        ep = models.endpoint(model_name)
        lines = worker_lines(model_name)
        chosen = live_targets(ep) if version == "all" else [find_target(ep, version)]
        return [describe(ep, target, lines) for target in chosen]

    async def scale(request: Request, model_name: str, version: str | None):
        params = request.query_params
        workers, version = scale_workers(params), version or params.get("model_version")
        wait_s = startup_timeout(params)
        before = await run_in_threadpool(models.set_options, model_name, version, {"workers": workers})
        if not flag(params, "synchronous"):
            return JSONResponse(PROCESSING, 202)
        status = await settled(model_name, wait_s)
        if status["state"] == "failed":
            await run_in_threadpool(models.restore_options, model_name, before)
            raise bad_request(f"the workers could not run {model_name} with {workers} handler processes each: "
                              f"{status['error']}; its workers were set back")
        if status["state"] != "ready":
            raise not_ready(f"{model_name} is scaled to {workers} workers", status, wait_s, model_name)
        return {"status": f"Workers scaled to {workers} for model: {model_name}"
                          + (f", version: {version}" if version else "")}

    @app.put("/models/{model_name}")
    async def scale_default(request: Request, model_name: str):
        return await scale(request, model_name, None)

    @app.put("/models/{model_name}/{version}")
    async def scale_version(request: Request, model_name: str, version: str):
        return await scale(request, model_name, version)

    @app.put("/models/{model_name}/{version}/set-default")
    def set_default(model_name: str, version: str):
        label = models.set_default(model_name, version)
        return {"status": f'Default version of model "{model_name}" is now "{label}"'}

    @app.delete("/models/{model_name}")
    def unregister_default(model_name: str):
        models.unregister(model_name, None)
        return {"status": f'Model "{model_name}" unregistered'}

    @app.delete("/models/{model_name}/{version}")
    def unregister_version(model_name: str, version: str):
        models.unregister(model_name, version)
        return {"status": f'Model "{model_name}" unregistered'}


def _archive_info(path, url: str) -> ArchiveInfo:
    try:
        return read_archive(path)
    except ArchiveError as exc:
        raise bad_request(f"{url} is not a TorchServe model archive: {exc}") from None


def _model_name(name: str) -> str:
    """TorchServe's model name is the endpoint's name: a URL segment (``/predictions/NAME``)."""
    try:
        return endpoint_name(name)
    except ValueError as exc:
        raise bad_request(f"model_name: {exc}") from None


def _named(done: Registration) -> str:
    return f'model "{done.name}" version {done.label}'
