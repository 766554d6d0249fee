"""OpenAI's API on the workers, at ``/serve/openai/v1/``: a thin front end over relay/generation.py.

``chat/completions``, ``completions``, ``embeddings`` (an LLM engine's, or an encoder endpoint's:
serving/embeddings/openai.py) and ``models`` (the LLM and encoder endpoints). ``model`` names the
endpoint. What this module does is the wire only: read the body under the size limit, check its shape
(protocol.py), check the client key, answer JSON or
pass Server-Sent Events on as they come, and write every error in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` with its status, never FastAPI's ``{"detail"}``.

A client that goes away cancels its request: a stream's upstream connection is closed (vLLM then
aborts the generation, freeing its slot), and so is a non-streaming call still waiting for its answer.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from serving.worker.errors import BadRequest, PayloadTooLarge, ServingError, TooLarge
from serving.worker.frontends.body import ROUTING_HEADER, VERSION_HEADER, json_response, parse_json, read_body
from serving.embeddings.openai import embed, encoder_task
from serving.llm.relay.hints import SESSION_HEADER
from serving.llm.openai.routes import ROUTES, checked
from serving.llm.openai.protocol import InvalidRequest
from serving.llm.relay.generation import Generation, split_model
from serving.worker.lifecycle import CLIENT_CLOSED

PREFIX = "/serve/openai/v1"
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 409: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error"}
_CODES = {401: "invalid_api_key", 403: "endpoint_not_allowed", 404: "model_not_found", 429: "rate_limit_exceeded",
          503: "engine_unavailable", 504: "timeout"}
T = TypeVar("T")


def openai_error(exc: ServingError) -> Response:
    """Any of the worker's errors in OpenAI's shape; an engine's own error object is kept as it said it."""
    if isinstance(exc, TooLarge):  # an input past the model's length, or too many inputs
        exc = InvalidRequest(exc.message, param="input", code="context_length_exceeded")
    elif isinstance(exc, PayloadTooLarge):  # OpenAI answers an oversized request with a 400
        exc = InvalidRequest(exc.message, code="request_too_large")
    status = exc.status
    error: dict[str, Any] = {"message": exc.message, "type": _TYPES.get(status, "server_error"),
                             "param": getattr(exc, "param", None), "code": getattr(exc, "code", None) or
                             _CODES.get(status)}
    engine_said = getattr(exc, "error", None)  # the engine's own OpenAI error (serving/llm/engines/vllm.py)
    if isinstance(engine_said, dict):
        error |= {k: v for k, v in engine_said.items() if k in error and v is not None}
    return json_response({"error": error}, status_code=status, headers=exc.headers)


class EventStream(StreamingResponse):
    """Server-Sent Events, each sent as it comes; the client's disconnect is watched all along (not
    only when the next event is sent), and ends the stream at once."""

    media_type = "text/event-stream"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def until_done(work: Any) -> None:
                    try:
                        await work()
                    except OSError:  # the client is gone: nothing more to send
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(until_done, lambda: self.stream_response(send))
                await until_done(lambda: self.listen_for_disconnect(receive))
        finally:
            await self.body_iterator.aclose()


class ClientGone(ServingError):
    """The client hung up before its answer: nobody reads this status (nginx's 499), but the request ends
    as an answer, not as a cancelled task the server would log as a failure."""

    status = CLIENT_CLOSED


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``work``, cancelled if the client disconnects first (the body is read: the next message is the
    disconnect); cancelling it closes the engine's connection, and the engine stops generating."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(request.receive())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done and watch.result().get("type") == "http.disconnect":
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                raise ClientGone("the client closed the connection before the answer") from None
        return await task
    finally:
        watch.cancel()
        task.cancel()


def openai_router(generation: Generation, max_body_bytes: int) -> APIRouter:
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    keys = generation.dataplane.keys

    async def read(request: Request, route: str) -> dict[str, Any]:
        doc = parse_json(await read_body(request, max_body_bytes))
        try:
            return checked(route, doc)
        except InvalidRequest as exc:  # counted in the endpoint's error rate, when it names one
            if isinstance(doc, dict) and isinstance(doc.get("model"), str):
                generation.dataplane.reject(split_model(doc["model"])[0], exc.status)
            raise

    async def generate(request: Request, route: str) -> Response:
        try:
            doc = await read(request, route)
            name, _ = split_model(doc["model"])
            client = keys.check_authorization(request.headers.get("authorization"), name)
            done = await until_disconnect(request, generation.run(route, doc, request.headers.get(ROUTING_HEADER),
                                                                  client, request.headers.get(SESSION_HEADER)))
        except ServingError as exc:
            return openai_error(exc)
        headers = {VERSION_HEADER: str(done.target.version)}
        if done.events is not None:
            return EventStream(done.events, headers={**headers, "Cache-Control": "no-cache",
                                                     "X-Accel-Buffering": "no"})
        return json_response(done.body, headers=headers)

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat/completions")

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completions")

    @router.post("/embeddings")
    async def embeddings(request: Request) -> Response:
        try:
            doc = await read(request, "embeddings")
            name, _ = split_model(doc["model"])
            client = keys.check_authorization(request.headers.get("authorization"), name)
            ep = generation.dataplane.endpoint(name)
            routing = request.headers.get(ROUTING_HEADER)
            if generation.is_llm(ep):  # the engine's own embeddings
                done = await until_disconnect(request, generation.run("embeddings", doc, routing, client))
                target, body = done.target, done.body
            else:
                answered, body = await until_disconnect(request, embed(generation.dataplane, ep, doc, routing, client))
                target = answered.target
        except ServingError as exc:
            return openai_error(exc)
        return json_response(body, headers={VERSION_HEADER: str(target.version)})

    def describe(ep: Any) -> dict[str, Any]:
        target = ep.targets[0]
        limit = (target.engine_options.get("max_model_len") or target.llm.get("max_model_len")
                 or getattr(ep.processor, "max_length", None))
        task = encoder_task(ep)
        return {"id": ep.name, "object": "model", "created": 0, "owned_by": "serving",
                "max_model_len": limit, "versions": [t.version for t in ep.targets if not t.shadow],
                **({"task": task} if task else {})}

    def listed(allowed: frozenset[str] | None) -> list[Any]:
        """The LLM endpoints and the encoder endpoints (embeddings, rerank) a key may call."""
        endpoints = generation.dataplane.config.current.endpoints
        return [ep for name, ep in sorted(endpoints.items()) if (generation.is_llm(ep) or encoder_task(ep))
                and (allowed is None or name in allowed)]

    @router.get("/models")
    async def models(request: Request) -> Response:
        try:
            allowed = keys.scope(request.headers.get("authorization"))
        except ServingError as exc:
            return openai_error(exc)
        return json_response({"object": "list", "data": [describe(ep) for ep in listed(allowed)]})

    @router.get("/models/{model:path}")
    async def model(request: Request, model: str) -> Response:
        try:
            name, _ = split_model(model)
            keys.check_authorization(request.headers.get("authorization"), name)
            ep = generation.dataplane.endpoint(name)
            return json_response(describe(ep if encoder_task(ep) else generation.llm_endpoint(name)))
        except ServingError as exc:
            return openai_error(exc)

    @router.post("/feedback")
    async def feedback(request: Request) -> Response:
        """Ground truth for an answer: ``{"model", "request_id", "label" | "value"}`` (serving/worker/feedback.py)."""
        try:
            doc = parse_json(await read_body(request, max_body_bytes))
            model = doc.get("model") if isinstance(doc, dict) else None
            if not isinstance(model, str) or not model:
                raise BadRequest("feedback names its endpoint in 'model', as the request did")
            name, _ = split_model(model)
            client = keys.check_authorization(request.headers.get("authorization"), name)
            joined = await generation.dataplane.feedback(name, {k: v for k, v in doc.items() if k != "model"}, client)
        except ServingError as exc:
            return openai_error(exc)
        return json_response(joined)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def elsewhere(request: Request, rest: str) -> Response:
        known = rest.strip("/") in (*ROUTES, "models", "feedback")
        status = 405 if known else 404
        message = (f"{request.method} is not allowed on {PREFIX}/{rest}" if known else
                   f"no route {PREFIX}/{rest}; the routes are {', '.join(ROUTES)} (POST) and models (GET)")
        return json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": "method_not_allowed" if known else "unknown_url"}},
                             status_code=status)

    return router
