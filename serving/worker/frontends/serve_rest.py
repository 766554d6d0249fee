"""ClearML-Serving-shaped REST: ``POST /serve/{endpoint}`` and ``/serve/{endpoint}/{version}``.

One door: ``ServeRoute``, an ASGI layer in front of FastAPI's router, takes exactly the requests
its path templates (``SERVE_PATHS``) match and answers them without FastAPI's routing,
dependency solving and middleware passes, about a third of the worker's CPU per request on an
echo endpoint (docs/benchmarks.md, W0). The OpenAPI document's description of these paths is
generated from the same templates (``openapi_paths``), so what is served and what is documented
cannot drift apart. Anything else goes on to FastAPI unchanged.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import Request, Response

from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, ServingError
from serving.worker.frontends.body import (ROUTING_HEADER, VERSION_HEADER, answer_response, json_response, parse_json,
                                          read_decoded_body, read_serve_body)
from serving.worker.frontends.openapi_bodies import SERVE_BODY



MAX_VERSION = 2**31 - 1  # as in the registry
RESERVED = ("openai", "tei")  # /serve/openai/v1/..., /serve/tei/{endpoint}/...: other front ends, not endpoints
# The served paths; each {parameter} is one non-empty path segment.
SERVE_PATHS = {
    "/serve/{endpoint}": "Infer with the endpoint's routing (canary weights, X-Routing-Key)",
    "/serve/{endpoint}/{version}": "Infer with one model version of the endpoint",
}
_PARAMETER = re.compile(r"\{(\w+)\}")


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(_PARAMETER.sub(r"(?P<\1>[^/]+)", template))


_MATCHERS = [_pattern(template) for template in SERVE_PATHS]
FEEDBACK_PATH = "/serve/{endpoint}/feedback"  # ground truth for a request (serving/worker/feedback.py)
_FEEDBACK = _pattern(FEEDBACK_PATH)


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


async def feedback(dataplane: DataPlane, max_body_bytes: int, request: Request, endpoint: str) -> Response:
    client = dataplane.keys.check_authorization(request.headers.get("authorization"), endpoint)
    body = parse_json(await read_decoded_body(request, max_body_bytes))
    return json_response(await dataplane.feedback(endpoint, body, client))


def error_response(exc: ServingError) -> Response:
    return json_response({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def match_serve_path(path: str) -> tuple[str, str | None] | None:
    """(endpoint, version or None) when ``path`` is one of ``SERVE_PATHS``."""
    for matcher in _MATCHERS:
        found = matcher.fullmatch(path)
        if found is not None and found["endpoint"] not in RESERVED:
            return found["endpoint"], found.groupdict().get("version")
    return None


def openapi_paths() -> dict[str, dict]:
    """The OpenAPI description of ``SERVE_PATHS``, merged into the worker's document (app.py)."""
    error = {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}
    paths = {}
    for template, summary in SERVE_PATHS.items():
        parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                      for name in _PARAMETER.findall(template)]
        parameters.append({"name": ROUTING_HEADER, "in": "header", "required": False, "schema": {"type": "string"}})
        responses = {"200": {"description": "The answer of the endpoint's postprocess",
                             "headers": {VERSION_HEADER: {"schema": {"type": "integer"}}},
                             "content": {"application/json": {"schema": {}}}}}
        responses |= {code: {"description": why, **error} for code, why in (
            ("401", "no valid client key"), ("403", "key outside its endpoints"), ("404", "unknown endpoint or version"),
            ("413", "body too large"), ("415", "unsupported content type"), ("422", "input the endpoint cannot take"),
            ("429", "over the key's rate"), ("503", "model or Triton not ready; see Retry-After"),
            ("504", "user code past its deadline"))}
        operation_id = "serve_" + "_".join(_PARAMETER.findall(template))
        paths[template] = {"post": {"summary": summary, "operationId": operation_id, "parameters": parameters,
                                    **SERVE_BODY, "responses": responses}}
    paths[FEEDBACK_PATH] = {"post": {
        "summary": "Ground truth for one request: its X-Request-Id and the true label or value (docs/prediction-log.md)",
        "operationId": "serve_feedback", "parameters": parameters[:1],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["request_id"], "properties": {
                "request_id": {"type": "string"}, "label": {"type": ["string", "integer"]}, "value": {"type": "number"}}}}}},
        "responses": {"200": {"description": "joined: the request's version, prediction and whether it was right",
                              "content": {"application/json": {"schema": {}}}},
                      **{code: {"description": why, **error} for code, why in (
                          ("400", "not a request id with one label or value"), ("404", "unknown endpoint or request id"),
                          ("409", "the request has its feedback already"), ("503", "no statistics service to join it"))}}}}
    return paths


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
            match = match_serve_path(path)
            if match is not None:
                request = Request(scope, receive, send)
                try:
                    found = _FEEDBACK.fullmatch(path)
                    response = await (feedback(self.dataplane, self.max_body_bytes, request, found["endpoint"])
                                      if found is not None and found["endpoint"] not in RESERVED else
                                      serve(self.dataplane, self.max_body_bytes, request, *match))
                except ServingError as exc:
                    response = error_response(exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
