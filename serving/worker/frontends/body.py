"""Read a request body with a size cap, before any parsing: a huge body must cost a 413, not memory."""
from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response

from serving.worker.errors import BadRequest, PayloadTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    if not raw:
        raise BadRequest("empty request body; send a JSON document")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


async def read_json(request: Request, limit: int) -> Any:
    return parse_json(await read_body(request, limit))


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson straight to bytes: numpy-derived floats and lists without FastAPI's encoder pass."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status_code,
                    headers=headers, media_type="application/json")
