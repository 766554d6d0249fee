"""ClearML-Serving-shaped REST: ``POST /serve/{endpoint}`` and ``/serve/{endpoint}/{version}``."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, ServingError
from serving.worker.frontends.body import answer_response, read_serve_body
from serving.worker.frontends.openapi_bodies import SERVE_BODY

VERSION_HEADER = "X-Model-Version"
ROUTING_HEADER = "X-Routing-Key"


MAX_VERSION = 2**31 - 1  # as in the registry


def parse_version(text: str) -> int:
    """ASCII digits only: str.isdigit() also takes '¹' or '٣', which int() then refuses."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_VERSION:
        raise NotFound(f"model version must be an integer from 1 to {MAX_VERSION}, got {text!r}")
    return int(text)


def serve_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    async def serve(request: Request, endpoint: str, version: int | None) -> Response:
        try:
            body = await read_serve_body(request, max_body_bytes)
        except ServingError as exc:
            dataplane.reject(endpoint, exc.status)
            raise
        answer = await dataplane.infer(endpoint, body, version, request.headers.get(ROUTING_HEADER))
        return answer_response(answer.body, headers={VERSION_HEADER: str(answer.target.version)})

    @router.post("/serve/{endpoint}", openapi_extra=SERVE_BODY)
    async def serve_latest(endpoint: str, request: Request) -> Response:
        return await serve(request, endpoint, None)

    @router.post("/serve/{endpoint}/{version}", openapi_extra=SERVE_BODY)
    async def serve_version(endpoint: str, version: str, request: Request) -> Response:
        return await serve(request, endpoint, parse_version(version))

    return router
