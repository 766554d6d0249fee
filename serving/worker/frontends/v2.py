"""Open Inference Protocol v2 (KServe / Triton HTTP), so stock clients such as ``tritonclient.http`` work.

A v2 "model" is an endpoint: ``infer`` routes by canary weight like ``/serve``
and takes the model's tensors directly (no preprocessing); ``versions/{v}``
pins a model version. A tokenizer endpoint also takes text (v2_text.py). Bodies may be gzip or
deflate (``Content-Encoding``, body.py). Triton's statistics extension is
``/v2/models[/{name}[/versions/{v}]]/stats``. With client keys required, everything under
``/v2/models/{name}`` needs a key that may call that endpoint; the server's metadata and health
routes stay open (probes).
"""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from serving.worker.dataplane import DataPlane
from serving.worker.errors import ServingError
from serving.worker.frontends.body import ROUTING_HEADER, VERSION_HEADER, json_response, parse_json, read_decoded_body
from serving.worker.frontends.openapi_bodies import V2_INFER_BODY
from serving.worker.frontends.serve_rest import parse_version
from serving.worker.frontends.v2_codec import HEADER_LENGTH, decode_request, encode_response
from serving.worker.frontends.v2_models import (SERVER_METADATA, check_model_ready, check_server_ready, model_metadata,
                                                model_statistics)
from serving.worker.frontends.v2_text import infer_v2


def v2_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter(prefix="/v2")

    @router.get("")
    def server_metadata() -> dict:
        return SERVER_METADATA

    @router.get("/health/live")
    def live() -> dict:
        return {"live": True}

    @router.get("/health/ready")
    def ready() -> dict:
        check_server_ready(dataplane)
        return {"ready": True}

    def client(request: Request, name: str) -> str | None:
        return dataplane.keys.check_authorization(request.headers.get("authorization"), name)

    def metadata(name: str, version: str | None) -> dict:
        return model_metadata(dataplane, name, version)

    async def model_ready(name: str, version: str | None = None) -> dict:
        await check_model_ready(dataplane, name, version)
        return {"name": name, "ready": True}

    async def infer(request: Request, name: str, version: str | None) -> Response:
        key = client(request, name)
        try:
            raw = await read_decoded_body(request, max_body_bytes)  # Content-Encoding undone first
            req = decode_request(raw, request.headers.get(HEADER_LENGTH))
        except ServingError as exc:
            dataplane.reject(name, exc.status, key)
            raise
        target, outputs = await infer_v2(dataplane, name, req, parse_version(version) if version else None,
                                         request.headers.get(ROUTING_HEADER), client=key)
        body, headers = encode_response(name, target.version, req, outputs)
        return Response(body, headers={**headers, VERSION_HEADER: str(target.version)})

    # Triton's statistics extension; before /models/{name}, which would take "stats" as a name
    @router.get("/models/stats")
    async def all_statistics(request: Request) -> Response:
        return json_response(await model_statistics(dataplane, None, None))

    @router.get("/models/{name}/stats")
    async def statistics(name: str, request: Request) -> Response:
        client(request, name)
        return json_response(await model_statistics(dataplane, name, None))

    @router.get("/models/{name}/versions/{version}/stats")
    async def version_statistics(name: str, version: str, request: Request) -> Response:
        client(request, name)
        return json_response(await model_statistics(dataplane, name, version))

    @router.get("/models/{name}")
    def latest_metadata(name: str, request: Request) -> Response:
        client(request, name)
        return json_response(metadata(name, None))

    @router.get("/models/{name}/versions/{version}")
    def version_metadata(name: str, version: str, request: Request) -> Response:
        client(request, name)
        return json_response(metadata(name, version))

    @router.get("/models/{name}/ready")
    async def ready_latest(name: str, request: Request) -> dict:
        client(request, name)
        return await model_ready(name)

    @router.get("/models/{name}/versions/{version}/ready")
    async def ready_version(name: str, version: str, request: Request) -> dict:
        client(request, name)
        return await model_ready(name, version)

    @router.post("/models/{name}/infer", openapi_extra=V2_INFER_BODY)
    async def infer_latest(name: str, request: Request) -> Response:
        return await infer(request, name, None)

    @router.post("/models/{name}/versions/{version}/infer", openapi_extra=V2_INFER_BODY)
    async def infer_version(name: str, version: str, request: Request) -> Response:
        return await infer(request, name, version)

    @router.post("/models/{name}/feedback")
    async def feedback(name: str, request: Request) -> Response:
        """Ground truth for a request of this model: ``{"request_id", "label" | "value"}`` (feedback.py)."""
        key = client(request, name)
        body = parse_json(await read_decoded_body(request, max_body_bytes))
        return json_response(await dataplane.feedback(name, body, key))

    return router
