"""What every front end shares: the platform's two headers, and a request body read with a size cap,
before any parsing (a huge body must cost a 413, not memory; the same cap again after
``Content-Encoding``, gzip or deflate, is undone)."""
from __future__ import annotations

import zlib
from typing import Any

import orjson
from fastapi import Request, Response

from serving.worker.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

VERSION_HEADER = "X-Model-Version"  # the version that answered
ROUTING_HEADER = "X-Routing-Key"  # a sticky key: the same key, the same canary version


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


# Content-Encoding -> zlib's wbits: gzip's header and trailer, zlib's (what HTTP calls "deflate")
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
RAW_DEFLATE = -zlib.MAX_WBITS  # some clients send "deflate" without zlib's header: taken too


def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """Unpack one ``Content-Encoding``; the limit applies to what it unpacks to, and inflating stops
    one byte past it, so a small body that would unpack to gigabytes costs at most ``limit``."""
    wbits = WBITS[encoding]
    if encoding == "deflate" and raw[:1] and (raw[0] & 0x0F != 8 or int.from_bytes(raw[:2], "big") % 31):
        wbits = RAW_DEFLATE  # not a zlib header
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"Content-Encoding is {encoding} but the body is not valid {encoding} data: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLarge(f"{encoding} body unpacks to over the limit of {limit} bytes")
    if not inflater.eof:
        raise BadRequest(f"Content-Encoding is {encoding} but the body is a truncated {encoding} stream")
    return out


def decode_content(raw: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body as sent before ``Content-Encoding`` (gzip or deflate, or none), for every front end."""
    encodings = [e.strip().lower() for e in (content_encoding or "").split(",") if e.strip()]
    if not encodings or encodings == ["identity"]:
        return raw
    if len(encodings) != 1 or encodings[0] not in WBITS:
        raise UnsupportedMediaType(f"Content-Encoding {', '.join(encodings)} is not supported; "
                                   f"use {' or '.join(WBITS)}")
    return inflate(raw, encodings[0], limit)


async def read_decoded_body(request: Request, limit: int) -> bytes:
    """The body, size-capped as sent and again as unpacked."""
    return decode_content(await read_body(request, limit), request.headers.get("content-encoding"), limit)


def is_json(content_type: str) -> bool:
    """JSON, and what curl sends without ``-H`` (form-urlencoded) or no type at all: read as JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("", "application/json", "application/x-www-form-urlencoded") or media.endswith("+json")


async def read_serve_body(request: Request, limit: int) -> Any:
    """A JSON document, or for any other content type the raw bytes (ClearML passes those to
    ``preprocess`` as ``bytes``: an image posted with ``--data-binary @5.jpg``)."""
    raw = await read_decoded_body(request, limit)
    if is_json(request.headers.get("content-type", "")):
        return parse_json(raw)
    return raw


def _plain(value: Any) -> Any:
    """What orjson cannot write itself: numpy scalars, sets and tuples-of-odd-things, bytes; else str()."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return str(value)


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson straight to bytes: numpy-derived floats and lists without FastAPI's encoder pass."""
    return Response(orjson.dumps(content, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY),
                    status_code=status_code, headers=headers, media_type="application/json")


def answer_response(content: Any, headers: dict[str, str] | None = None) -> Response:
    """A postprocess that returns bytes answers them as they are (an image, a file), as ClearML Serving
    does; anything else as JSON."""
    if isinstance(content, (bytes, bytearray, memoryview)):
        return Response(bytes(content), headers=headers, media_type="application/octet-stream")
    return json_response(content, headers=headers)
