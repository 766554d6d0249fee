"""Request builders, by name: the load generator runs in another process, so a system
names how its requests look instead of handing over a function.

Bodies are encoded once, before the clock starts, so the client's cost per
request is only the HTTP exchange.
"""
from __future__ import annotations

import json
from typing import Callable


def text_json(text: str) -> bytes:
    """This platform's ``POST /serve/{endpoint}`` and the FastAPI baseline: ``{"text": ...}``."""
    return json.dumps({"text": text}).encode()


def triton_v2_text(text: str) -> bytes:
    """Open Inference Protocol (KServe v2) JSON with one BYTES input ``text`` of shape [1, 1]."""
    return json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}).encode()


def triton_v2_text_nobatch(text: str) -> bytes:
    """The same for a model without batching: no batch dimension, shape [1]."""
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}).encode()


BUILDERS: dict[str, Callable[[str], bytes]] = {
    "text_json": text_json, "triton_v2_text": triton_v2_text, "triton_v2_text_nobatch": triton_v2_text_nobatch,
}


def openai_embeddings(texts: list[str], model: str) -> bytes:
    """OpenAI's ``POST /embeddings`` (this platform, Infinity, the sentence-transformers baseline), floats."""
    return json.dumps({"model": model, "input": texts, "encoding_format": "float"}).encode()


def encode_all(kind: str, texts: list[str]) -> list[bytes]:
    """Every request body of the corpus, built before the load starts. ``embeddings:N:MODEL``: OpenAI
    embeddings requests of N consecutive texts each (the corpus read as a ring) for ``MODEL``."""
    if kind.startswith("embeddings:"):
        _, size, model = kind.split(":", 2)
        n = int(size)
        return [openai_embeddings([texts[(i + k) % len(texts)] for k in range(n)], model)
                for i in range(0, len(texts), n)]
    build = BUILDERS[kind]
    return [build(text) for text in texts]
