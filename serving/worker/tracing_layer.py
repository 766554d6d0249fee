"""The worker's edge for tracing and error bodies (an ASGI layer just inside request_ids.py's).

- A client's ``traceparent`` is checked first: a malformed one is refused with a 400 in the front end's
  own error shape (``refuse``, given by the app, knows them), before anything runs.
- With tracing on, the request runs inside its server span (serving/tracing/spans.py): the client's
  trace continued, or a new one. The span is named by the route's template, never by an endpoint's name
  (span names are a bounded set), and carries the endpoint, the status and the request id.
- Every JSON error body gets the request's ``request_id`` and, with tracing on, its ``trace_id``: what a
  user quotes when asking why a request failed, and what finds it in the prediction log and the traces.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import orjson

from serving.errors import ServiceError
from serving.tracing import spans
from serving.tracing.traceparent import HEADER, check
from serving.worker import request_ids

# (pattern, span name): the first that matches the path names the server span
TEMPLATES = [(re.compile(p), name) for p, name in (
    (r"^/serve/openai/v1/(chat/completions|completions|embeddings|feedback)$", r"/serve/openai/v1/\1"),
    (r"^/serve/tei/[^/]+/([\w/]+)$", r"/serve/tei/{endpoint}/\1"),
    (r"^/serve/[^/]+/feedback$", "/serve/{endpoint}/feedback"),
    (r"^/serve/[^/]+/[^/]+$", "/serve/{endpoint}/{version}"),
    (r"^/serve/[^/]+$", "/serve/{endpoint}"),
    (r"^/v2/models/[^/]+(/versions/[^/]+)?/(infer|feedback)$", r"/v2/models/{name}\1/\2"),
    (r"^/(predictions|explanations)/.+$", r"/\1/{name}"),
)]
UNTRACED = ("/v2/health/", "/status", "/metrics")  # probes: a span each would bury the requests' traces
ENDPOINT = re.compile(r"^/(?:serve(?:/tei)?|v2/models|predictions|explanations)/([^/]+)")
Refuse = Callable[[str, ServiceError], Any]  # path, error -> the front end's error response


def span_name(method: str, path: str) -> str:
    for pattern, name in TEMPLATES:
        if pattern.match(path):
            return f"{method} {pattern.sub(name, path)}"
    return f"{method} {path if path.count('/') <= 2 else 'other'}"


class TracingLayer:
    def __init__(self, app: Any, refuse: Refuse) -> None:
        self.app, self.refuse = app, refuse

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers") or [] if k.lower() == HEADER.encode()), None)
        traceparent = None
        if given is not None:
            try:
                traceparent = check(given.decode("latin-1"))
            except ServiceError as exc:
                await self.refuse(scope["path"], exc)(scope, receive, _with_ids(send, None))
                return
        path, method = scope["path"], scope.get("method", "GET")
        if path.startswith(UNTRACED):
            await self.app(scope, receive, _with_ids(send, None))
            return
        endpoint = ENDPOINT.match(path)
        attributes = {"http.method": method, "http.target": path[:200], "serving.request_id": request_ids.current()}
        if endpoint is not None and endpoint[1] not in ("openai", "tei"):
            attributes["serving.endpoint"] = endpoint[1]
        with spans.request_span(span_name(method, path), traceparent, **attributes) as span:
            await self.app(scope, receive, _with_ids(send, span))


def _with_ids(send: Any, span: Any) -> Any:
    """``send``, with the request and trace ids added to a JSON error body (errors are small: held whole)."""
    held: dict[str, Any] = {}

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            if span is not None:
                span.set_attribute("http.status_code", message["status"])
            if message["status"] >= 400 and _is_json(message):
                held["start"] = message
                return
        elif message["type"] == "http.response.body" and "start" in held:
            held["body"] = held.get("body", b"") + message.get("body", b"")
            if message.get("more_body"):
                return
            start, body = held.pop("start"), _annotated(held.pop("body"))
            headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return sending


def _is_json(start: dict) -> bool:
    return any(k.lower() == b"content-type" and b"json" in v.lower() for k, v in start.get("headers") or [])


def _annotated(body: bytes) -> bytes:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(doc, dict):
        return body
    ids = {"request_id": request_ids.current(), "trace_id": spans.trace_id()}
    return orjson.dumps({**doc, **{k: v for k, v in ids.items() if v and k not in doc}})
