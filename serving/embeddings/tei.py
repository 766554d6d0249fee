"""Hugging Face text-embeddings-inference's HTTP API on the workers, at ``/serve/tei/{endpoint}``.

Why that prefix: a TEI server serves one model at its root (``/embed``, ``/rerank``, ``/tokenize``,
``/info``, ``/health``, ``/v1/embeddings``, and ``POST /``); a worker serves many endpoints. With the
endpoint in the base URL, a TEI client pointed at ``http://worker:9090/serve/tei/NAME`` sends its
requests unchanged, and everything under ``/serve`` (client keys, a gateway's routes, the request
size cap) covers it as it covers ``/serve/NAME``. ``tei`` and ``openai`` are therefore not endpoint
names (registry/schemas.py).

TEI's field names, defaults and answers: ``/embed`` takes ``inputs`` (a string or a list),
``normalize`` (default true), ``truncate`` (default false: a text past the model's length is a 413),
``dimensions``; ``/rerank`` takes ``query``, ``texts``, ``raw_scores``, ``return_text``, ``truncate``
and answers ``[{"index", "score"[, "text"]}]`` sorted by score; ``/tokenize`` answers each token's
``id``, ``text``, ``special``, ``start``, ``stop``. Fields may also come under ``parameters`` (what
``huggingface_hub``'s ``InferenceClient`` sends to ``POST /``). Errors are TEI's
``{"error": ..., "error_type": ...}`` (``Validation``, ``Empty``, ``Tokenizer``, ``Overloaded``,
``Unhealthy``, ``Backend``) with TEI's statuses where TEI has the case (413 past a limit, 400 for no
input, 429, 503), the platform's elsewhere (401, 403, 404).
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from serving.worker.dataplane import DataPlane
from serving.worker.errors import BadRequest, NotFound, ServingError, Unavailable, Unprocessable
from serving.worker.frontends.body import ROUTING_HEADER, VERSION_HEADER, json_response, parse_json, read_body
from serving.embeddings.openai import encoder_task

PREFIX = "/serve/tei"
ROUTES = ("embed", "rerank", "tokenize", "v1/embeddings", "info", "health")
_TYPES = {400: "Validation", 413: "Validation", 422: "Validation", 429: "Overloaded", 503: "Unhealthy"}


class Empty(BadRequest):
    """No input at all (TEI's ``Empty``)."""


def tei_error(exc: ServingError) -> Response:
    kind = "Empty" if isinstance(exc, Empty) else _TYPES.get(exc.status) or (
        "Backend" if exc.status >= 500 else "Validation")
    return json_response({"error": exc.message, "error_type": kind}, status_code=exc.status, headers=exc.headers)


def _fields(doc: Any) -> dict[str, Any]:
    """The request's fields; those under ``parameters`` (huggingface_hub's form) count as top-level ones."""
    if not isinstance(doc, dict):
        raise Unprocessable("the body must be a JSON object")
    params = doc.get("parameters")
    return {**(params if isinstance(params, dict) else {}), **{k: v for k, v in doc.items() if k != "parameters"}}


def _inputs(fields: dict[str, Any], name: str = "inputs") -> list[str]:
    value = fields.get(name)
    if value is None:
        raise Unprocessable(f"missing field `{name}`: a string or a list of strings")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise Unprocessable(f"`{name}` must be a string or a list of strings")
    if not texts:
        raise Empty(f"`{name}` cannot be empty")
    return texts


def _bool(fields: dict[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise Unprocessable(f"`{name}` must be true or false")
    return value


def _rank(scores: Any, texts: list[str], return_text: bool) -> list[dict[str, Any]]:
    ranks = [{"index": i, "score": float(s), **({"text": texts[i]} if return_text else {})}
             for i, s in enumerate(scores)]
    return sorted(ranks, key=lambda r: -r["score"])


def tei_router(dataplane: DataPlane, max_body_bytes: int) -> APIRouter:
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    keys = dataplane.keys

    def encoder(name: str, task: str | None = None) -> Any:
        ep = dataplane.endpoint(name)
        found = encoder_task(ep)
        if found is None or (task is not None and found != task):
            wanted = {"embed": "an embedding", "rerank": "a cross-encoder"}.get(task or "", "an encoder")
            raise NotFound(f"endpoint {name!r} is not {wanted} endpoint"
                           + (f" (it is a {found} endpoint)" if found else "") + "; TEI's routes serve "
                           "embedding and cross-encoder endpoints (docs/embeddings.md)")
        return ep

    async def run(request: Request, name: str, route: str) -> Response:
        try:
            client = keys.check_authorization(request.headers.get("authorization"), name)
            try:
                fields = _fields(parse_json(await read_body(request, max_body_bytes)))
            except ServingError as exc:
                dataplane.reject(name, exc.status, client)
                raise
            return await ROUTE_HANDLERS[route](request, name, fields, client)
        except ServingError as exc:
            return tei_error(exc)

    async def embed(request: Request, name: str, fields: dict[str, Any], client: str | None) -> Response:
        encoder(name, "embed")
        body = {"texts": _inputs(fields), "truncate": _bool(fields, "truncate", False),
                "normalize": _bool(fields, "normalize", True)}
        if fields.get("dimensions") is not None:
            body["dimensions"] = fields["dimensions"]
        done = await dataplane.infer(name, body, None, request.headers.get(ROUTING_HEADER), client=client)
        return json_response(done.body["embeddings"], headers={VERSION_HEADER: str(done.target.version)})

    async def rerank(request: Request, name: str, fields: dict[str, Any], client: str | None) -> Response:
        encoder(name, "rerank")
        query = fields.get("query")
        if not isinstance(query, str):
            raise Unprocessable("missing field `query`: a string")
        texts = _inputs(fields, "texts")
        body = {"query": query, "texts": texts, "truncate": _bool(fields, "truncate", False),
                "raw_scores": _bool(fields, "raw_scores", False)}
        done = await dataplane.infer(name, body, None, request.headers.get(ROUTING_HEADER), client=client)
        ranks = _rank(done.body["scores"], texts, _bool(fields, "return_text", False))
        return json_response(ranks, headers={VERSION_HEADER: str(done.target.version)})

    async def default(request: Request, name: str, fields: dict[str, Any], client: str | None) -> Response:
        """TEI's ``POST /``: the model's own task."""
        handler = rerank if encoder_task(encoder(name)) == "rerank" else embed
        return await handler(request, name, fields, client)

    async def tokenize(request: Request, name: str, fields: dict[str, Any], client: str | None) -> Response:
        tokenizer = encoder(name).processor.tokenizer
        special = _bool(fields, "add_special_tokens", True)
        return json_response([[{"id": i, "text": t, "special": s, "start": None if s else a, "stop": None if s else b}
                               for i, t, s, (a, b) in tokenizer.tokens(text, special)]
                              for text in _inputs(fields)])

    async def openai_compatible(request: Request, name: str, fields: dict[str, Any], client: str | None) -> Response:
        encoder(name, "embed")
        body = {"texts": _inputs(fields, "input"), "truncate": _bool(fields, "truncate", False)}
        done = await dataplane.infer(name, body, None, request.headers.get(ROUTING_HEADER), client=client)
        tokens = int(sum(done.body["tokens"]))
        return json_response({"object": "list", "model": fields.get("model") or name,
                              "data": [{"object": "embedding", "index": i, "embedding": v}
                                       for i, v in enumerate(done.body["embeddings"])],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                             headers={VERSION_HEADER: str(done.target.version)})

    ROUTE_HANDLERS = {"": default, "embed": embed, "rerank": rerank, "tokenize": tokenize,
                      "v1/embeddings": openai_compatible}

    @router.get("/{endpoint}/info")
    async def info(endpoint: str, request: Request) -> Response:
        try:
            keys.check_authorization(request.headers.get("authorization"), endpoint)
            ep = encoder(endpoint)
            p = ep.processor
            kind = ({"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
                    if p.task == "rerank" else {"embedding": {"pooling": p.pooling}})
            target = ep.targets[0]
            return json_response({"model_id": f"{target.model}:{target.version}", "model_sha": target.artifact,
                                  "model_dtype": "float32", "model_type": kind, "max_input_length": p.max_length,
                                  "max_batch_tokens": p.max_batch_tokens, "max_batch_requests": target.max_batch or None,
                                  "max_client_batch_size": p.max_client_batch, "auto_truncate": False,
                                  "version": "serving", "sha": None, "docker_label": None})
        except ServingError as exc:
            return tei_error(exc)

    @router.get("/{endpoint}/health")
    async def health(endpoint: str, request: Request) -> Response:
        try:
            keys.check_authorization(request.headers.get("authorization"), endpoint)
            encoder(endpoint)
            if not await dataplane.ready(endpoint):
                raise Unavailable("the endpoint's model is not loaded yet", retry_after_s=1)
            return Response(status_code=200)
        except ServingError as exc:
            return tei_error(exc)

    @router.post("/{endpoint}")
    @router.post("/{endpoint}/")
    async def root(endpoint: str, request: Request) -> Response:
        return await run(request, endpoint, "")

    @router.post("/{endpoint}/{route:path}")
    async def routed(endpoint: str, route: str, request: Request) -> Response:
        route = route.strip("/")
        if route not in ROUTE_HANDLERS:
            known = ", ".join(f"/{r}" for r in ROUTES)
            return tei_error(NotFound(f"no route {PREFIX}/{endpoint}/{route}; TEI's routes here: {known} "
                                      "(POST; /info and /health: GET), and POST /"))
        return await run(request, endpoint, route)

    return router
