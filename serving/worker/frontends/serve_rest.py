"""ClearML-Serving-shaped REST: ``POST /serve/{endpoint}`` and ``/serve/{endpoint}/{version}``.

Two doors to one handler (``serve``): the FastAPI routes, which describe the API in the OpenAPI
document, and ``ServeRoute``, an ASGI layer in front of FastAPI's router that takes exactly the
requests those routes would (POST, one or two non-empty path segments after ``/serve/``) and
answers them without FastAPI's routing, dependency solving and middleware passes, about a third
of the worker's CPU per request on an echo endpoint (docs/benchmarks.md, W0). Anything else
goes on to FastAPI unchanged.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request, Response

from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, ServingError
from serving.worker.frontends.body import answer_response, json_response, read_serve_body
from serving.worker.frontends.openapi_bodies import SERVE_BODY

VERSION_HEADER = "X-Model-Version"
ROUTING_HEADER = "X-Routing-Key"


MAX_VERSION = 2**31 - 1  # as in the registry
SERVE_PATH = re.compile(r"/serve/([^/]+)(?:/([^/]+))?")  # the routes' {endpoint} and {version}: [^/]+


def parse_version(text: str) -> int:
    """ASCII digits only: str.isdigit() also takes '¹' or '٣', which int() then refuses."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_VERSION:
        raise NotFound(f"model version must be an integer from 1 to {MAX_VERSION}, got {text!r}")
    return int(text)


async def serve(dataplane: DataPlane, max_body_bytes: int, request: Request, endpoint: str,
                version: str | None) -> Response:
    headers = request.headers
    client = dataplane.keys.check_authorization(headers.get("authorization"), endpoint)  # first: 401 before 404
    pinned = parse_version(version) if version is not None else None
    try:
        body = await read_serve_body(request, max_body_bytes)
    except ServingError as exc:
        dataplane.reject(endpoint, exc.status, client)
        raise
    answer = await dataplane.infer(endpoint, body, pinned, headers.get(ROUTING_HEADER), client=client)
    return answer_response(answer.body, headers={VERSION_HEADER: str(answer.target.version)})


def error_response(exc: ServingError) -> Response:
    return json_response({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def serve_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    @router.post("/serve/{endpoint}", openapi_extra=SERVE_BODY)
    async def serve_latest(endpoint: str, request: Request) -> Response:
        return await serve(dataplane, max_body_bytes, request, endpoint, None)

    @router.post("/serve/{endpoint}/{version}", openapi_extra=SERVE_BODY)
    async def serve_version(endpoint: str, version: str, request: Request) -> Response:
        return await serve(dataplane, max_body_bytes, request, endpoint, version)

    return router


class ServeRoute:
    """ASGI: ``POST /serve/...`` straight to ``serve``; a ServingError becomes its JSON answer, as
    the app's exception handler writes it; anything else raised goes up to the app's last resort."""

    def __init__(self, app: Any, dataplane: DataPlane, max_body_bytes: int) -> None:
        self.app, self.dataplane, self.max_body_bytes = app, dataplane, max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root):]
            match = SERVE_PATH.fullmatch(path)
            if match is not None:
                request = Request(scope, receive, send)
                try:
                    response = await serve(self.dataplane, self.max_body_bytes, request, *match.groups())
                except ServingError as exc:
                    response = error_response(exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
