"""Open Inference Protocol v2 (KServe / Triton HTTP), so stock clients such as ``tritonclient.http`` work.

A v2 "model" is an endpoint: ``infer`` routes by canary weight like ``/serve``
and takes the model's tensors directly (no preprocessing); ``versions/{v}``
pins a model version. With client keys required, everything under ``/v2/models/{name}`` needs a
key that may call that endpoint; the server's metadata and health routes stay open (probes).
"""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from serving import __version__
from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, ServingError, Unavailable
from serving.worker.frontends.body import json_response, read_body
from serving.worker.frontends.openapi_bodies import V2_INFER_BODY
from serving.worker.frontends.serve_rest import ROUTING_HEADER, VERSION_HEADER, parse_version
from serving.worker.frontends.v2_codec import HEADER_LENGTH, decode_request, encode_response
from serving.worker.runtime import Target


def _tensors(specs: tuple[dict, ...]) -> list[dict]:
    return [{"name": s["name"], "datatype": s["dtype"], "shape": s.get("shape", [])} for s in specs]


def v2_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter(prefix="/v2")

    @router.get("")
    def server_metadata() -> dict:
        return {"name": "serving", "version": __version__, "extensions": ["binary_tensor_data"]}

    @router.get("/health/live")
    def live() -> dict:
        return {"live": True}

    @router.get("/health/ready")
    def ready() -> dict:
        if not dataplane.config.current.loaded:
            raise Unavailable("no configuration yet: the control plane is unreachable and there is no cache")
        return {"ready": True}

    def client(request: Request, name: str) -> str | None:
        return dataplane.keys.check_authorization(request.headers.get("authorization"), name)

    def metadata(name: str, version: str | None) -> dict:
        ep = dataplane.endpoint(name)
        if not ep.targets:
            raise NotFound(f"endpoint {name!r} serves no model version; it has no tensor metadata")
        target: Target = dataplane.route(ep, parse_version(version), None) if version else ep.targets[0]
        return {"name": name, "versions": [str(t.version) for t in ep.targets], "platform": ep.engine,
                "inputs": _tensors(target.inputs), "outputs": _tensors(target.outputs)}

    async def model_ready(name: str) -> dict:
        if not await dataplane.ready(name):
            raise Unavailable(f"model {name!r} is not ready: its engine has not loaded every version yet")
        return {"name": name, "ready": True}

    async def infer(request: Request, name: str, version: str | None) -> Response:
        key = client(request, name)
        try:
            req = decode_request(await read_body(request, max_body_bytes), request.headers.get(HEADER_LENGTH))
        except ServingError as exc:
            dataplane.reject(name, exc.status, key)
            raise
        target, outputs = await dataplane.infer_tensors(
            name, req.inputs, parse_version(version) if version else None, request.headers.get(ROUTING_HEADER),
            client=key)
        body, headers = encode_response(name, target.version, req, outputs)
        return Response(body, headers={**headers, VERSION_HEADER: str(target.version)})

    @router.get("/models/{name}")
    def model_metadata(name: str, request: Request) -> Response:
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
        dataplane.route(dataplane.endpoint(name), parse_version(version), None)
        return await model_ready(name)

    @router.post("/models/{name}/infer", openapi_extra=V2_INFER_BODY)
    async def infer_latest(name: str, request: Request) -> Response:
        return await infer(request, name, None)

    @router.post("/models/{name}/versions/{version}/infer", openapi_extra=V2_INFER_BODY)
    async def infer_version(name: str, version: str, request: Request) -> Response:
        return await infer(request, name, version)

    return router
