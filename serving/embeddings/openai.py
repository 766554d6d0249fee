"""OpenAI's ``POST /serve/openai/v1/embeddings`` on encoder endpoints (preprocess/encoder.py).

The request goes through the data plane as any ``/serve`` request does (routing, canary, shadow, the
token batcher, statistics); this module only translates OpenAI's fields: ``input`` as a string, a list
of strings, token ids or lists of them; ``encoding_format`` ``float`` or ``base64`` (little-endian
float32, what the ``openai`` client asks for by default and decodes); ``dimensions`` (the first N,
renormalized); ``usage.prompt_tokens``. As OpenAI does, an input past the model's length is an error
(400, ``context_length_exceeded``) unless the request asks for truncation (``truncate: true``, TEI's
field), and an empty string is refused. An LLM endpoint's embeddings go to its engine instead
(llm/relay.py).
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

from serving.worker.dataplane import Answer, DataPlane
from serving.llm.openai.protocol import InvalidRequest
from serving.llm.relay.generation import split_model
from serving.worker.runtime import EndpointRuntime

EMBED = "embed"


def encoder_task(ep: EndpointRuntime) -> str | None:
    """``embed`` or ``rerank`` for an encoder endpoint, else None."""
    return getattr(ep.processor, "task", None) if ep.preprocess_kind == "tokenizer" else None


def _body(doc: dict[str, Any]) -> dict[str, Any]:
    """The encoder's own request (preprocess/encoder.py) from OpenAI's fields."""
    given = doc["input"]
    if given == "" or given == [] or (isinstance(given, list) and "" in given):
        raise InvalidRequest("input: an empty string is not valid input; send text or token ids", param="input")
    if isinstance(given, str):
        body: dict[str, Any] = {"texts": [given]}
    elif all(isinstance(item, str) for item in given):
        body = {"texts": given}
    else:
        body = {"input_ids": given}
    body["truncate"] = bool(doc.get("truncate"))
    if doc.get("dimensions") is not None:
        body["dimensions"] = doc["dimensions"]
    return body


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def answer(doc: dict[str, Any], answer: Answer) -> dict[str, Any]:
    vectors, tokens = answer.body["embeddings"], answer.body["tokens"]
    encoding = doc.get("encoding_format") or "float"
    prompt = int(sum(tokens))
    return {"object": "list", "model": doc["model"],
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(v, encoding)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}


async def embed(dataplane: DataPlane, ep: EndpointRuntime, doc: dict[str, Any], routing_key: str | None,
                client: str | None) -> tuple[Answer, dict[str, Any]]:
    """The answer of an encoder endpoint to a checked OpenAI embeddings request."""
    if encoder_task(ep) != EMBED:
        raise InvalidRequest(f"model {doc['model']!r} is not an embedding endpoint (it is "
                             f"{encoder_task(ep) or 'a ' + ep.engine + ' endpoint'}); deploy an encoder with "
                             "--pooling or a sentence-transformers folder (docs/embeddings.md)", param="model",
                             code="model_not_supported")
    _, version = split_model(doc["model"])
    done = await dataplane.infer(ep.name, _body(doc), version, routing_key, client=client)
    return done, answer(doc, done)
