"""TorchServe's inference API on the workers: ``/predictions``, ``/explanations``, ``/ping``.

What a TorchServe user's clients send works unchanged, host and port aside: ``curl
http://HOST/predictions/mnist -T 0.png`` (a ``PUT`` of the raw file), ``POST`` of a raw body, or
multipart form data (``curl -F data=@0.png``), to the endpoint named as the model was registered,
optionally with a version (``/predictions/mnist/2``, our version number, or the archive's own
``--version`` string such as ``1.0``). The request is handed to the handler as TorchServe's frontend
hands it over (serving/torchserve/codec.py) and goes through the data plane like any other (canary,
shadow, keys, statistics), so only the wire format lives here. Errors answer in TorchServe's JSON
shape, ``{"code", "type", "message"}``, with its statuses for an unknown model (404) and version.
"""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response

from preprocess.handler import HandlerProcessor
from serving.torchserve.codec import HandlerAnswer, HandlerRequest, Parameter
from serving.worker.dataplane import DataPlane
from serving.worker import request_ids
from serving.worker.errors import BadRequest, NotFound, ServingError, UnknownEndpoint
from serving.worker.frontends.body import ROUTING_HEADER, VERSION_HEADER, json_response, read_body
from serving.worker.frontends.serve_rest import MAX_VERSION

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
# TorchServe's exception names by status, for errors the platform raises itself
ERROR_TYPES = {400: "BadRequestException", 401: "InvalidKeyException", 403: "InvalidKeyException",
               404: "ModelNotFoundException", 405: "MethodNotAllowedException", 413: "BadRequestException",
               415: "BadRequestException", 422: "BadRequestException", 429: "ServiceUnavailableException",
               503: "ServiceUnavailableException", 504: "RequestTimeoutException"}


class VersionNotFound(NotFound):
    pass


def ts_error(exc: ServingError, name: str = "") -> Response:
    """An error in TorchServe's shape: its exception names, and its words for an unknown model."""
    message, kind = exc.message, getattr(exc, "error_type", None) or ERROR_TYPES.get(exc.status,
                                                                                     "InternalServerException")
    if isinstance(exc, UnknownEndpoint):
        message = f"Model not found: {name} (endpoints: {exc.known})"
    elif isinstance(exc, VersionNotFound):
        kind = "ModelVersionNotFoundException"
    return json_response({"code": exc.status, "type": kind, "message": message}, status_code=exc.status,
                         headers=exc.headers)


async def handler_request(request: Request, limit: int, explain: bool, url_path: str = "") -> HandlerRequest:
    """The request as TorchServe's frontend hands it to a backend: the raw body as ``body`` with its
    content type, or each form field under its name (a file with its content type); the headers."""
    mime = _mime(request.headers.get("content-type", ""))
    if mime.lower() in FORM_TYPES:
        parameters = await _form(request, limit)
    else:
        parameters = [Parameter("body", await read_body(request, limit), mime)]
    headers = dict(request.headers)
    headers.update({"explain": "True" if explain else "False", "url_path": url_path})
    request_id = request_ids.current() or str(uuid.uuid4())  # the client's X-Request-Id, or the worker's
    return HandlerRequest(request_id=request_id, parameters=parameters, headers=headers)


async def _form(request: Request, limit: int) -> list[Parameter]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body of {declared} bytes is over the limit of {limit} bytes")
    try:
        form = await request.form(max_part_size=limit)
    except Exception as exc:  # python-multipart's parse errors, a missing boundary
        raise BadRequest(f"the form data cannot be read: {exc}") from None
    parameters = []
    for name, value in form.multi_items():
        if isinstance(value, str):  # a plain field: no content type, bytes to the handler
            parameters.append(Parameter(name, value.encode("utf-8"), ""))
        else:
            parameters.append(Parameter(name, await value.read(), _mime(value.content_type or "")))
    if not parameters:
        raise BadRequest("the form has no fields; send the input as a field (curl -F data=@file) or as the body")
    return parameters


def _mime(content_type: str) -> str:
    """A content type without its parameters, its case kept: TorchServe's backend decodes a value as JSON
    only for exactly ``application/json`` (``; charset=utf-8`` dropped, ``Application/JSON`` not)."""
    return content_type.split(";", 1)[0].strip()


def ts_response(answer: HandlerAnswer, version: int) -> Response:
    """The handler's bytes as TorchServe sends them: a content type only where the handler set one."""
    headers = {**answer.headers, VERSION_HEADER: str(version)}
    return Response(answer.body, status_code=answer.status, headers=headers, media_type=answer.content_type or None)


def torchserve_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    def pinned(name: str, version: str | None) -> int | None:
        """Our version number, or the archive's own version string (TorchServe's ``--version``)."""
        if version is None:
            return None
        ep = dataplane.endpoint(name)
        if version.isascii() and version.isdigit() and 1 <= int(version) <= MAX_VERSION:
            found = [int(version)] if ep.version(int(version)) is not None else []
        else:
            found = [t.version for t in ep.targets if t.archive_version == version]
        if not found:
            raise VersionNotFound(f"Model version: {version} does not exist for model: {name}")
        return found[-1]

    async def predict(request: Request, name: str, version: str | None, explain: bool, rest: str = "") -> Response:
        try:
            client = dataplane.keys.check_authorization(request.headers.get("authorization"), name)
            number = pinned(name, version)
            try:
                body = await handler_request(request, max_body_bytes, explain, rest)
            except ServingError as exc:
                dataplane.reject(name, exc.status, client)
                raise
            if not isinstance(dataplane.endpoint(name).processor, HandlerProcessor):
                raise BadRequest(f"endpoint {name!r} is not a TorchServe archive's; call it at /serve/{name} "
                                 "(TorchServe's API serves endpoints of engine torchserve)")
            done = await dataplane.infer(name, body, number, request.headers.get(ROUTING_HEADER), client=client)
        except ServingError as exc:
            return ts_error(exc, name)
        return ts_response(done.body, done.target.version)

    for prefix, explain in (("/predictions", False), ("/explanations", True)):
        def bind(explain: bool = explain) -> tuple[Any, Any, Any]:
            async def latest(request: Request, name: str) -> Response:
                return await predict(request, name, None, explain)

            async def versioned(request: Request, name: str, version: str) -> Response:
                return await predict(request, name, version, explain)

            async def deeper(request: Request, name: str, version: str, rest: str) -> Response:
                return await predict(request, name, version, explain, rest)  # TorchServe's url_path header
            return latest, versioned, deeper

        latest, versioned, deeper = bind()
        methods = ["POST", "PUT", "GET", "DELETE"]  # TorchServe hands every one to the handler (GET: empty body)
        router.add_api_route(prefix + "/{name}", latest, methods=methods)
        router.add_api_route(prefix + "/{name}/{version}", versioned, methods=methods)
        router.add_api_route(prefix + "/{name}/{version}/{rest:path}", deeper, methods=methods)

    @router.get("/ping")
    async def ping() -> Response:
        """TorchServe's health check: Healthy once this worker has a configuration and every
        endpoint in it loaded."""
        config = dataplane.config.current
        healthy = config.loaded and not config.errors
        return json_response({"status": "Healthy" if healthy else "Unhealthy"}, status_code=200 if healthy else 500)

    return router
