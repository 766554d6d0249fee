"""Every request's id, on every front end: the client's own ``X-Request-Id`` when it sends a usable one
(over gRPC, the ``x-request-id`` metadata), else a new one; returned in the answer's ``X-Request-Id``
(gRPC: initial metadata) and carried in the request's statistics event (``request_id``), so that a
client, a log line and an event name the same request.

Why an ASGI layer and a context variable: the id must be on every answer (errors from any front end,
streams, the OpenAI and TEI APIs alike) and reach the one request lifecycle (lifecycle.py) without each
front end passing it down. A client's id is kept as it is when it is 1 to 128 visible ASCII characters
(as proxies and tracing systems write them); anything else (too long, spaces, control characters) is
replaced by a new id rather than refused, because the id only labels the request. A new id is a random
UUID in its usual 36-character form, as TorchServe writes its own.
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

HEADER = b"x-request-id"
MAX_LENGTH = 128

_current: ContextVar[str | None] = ContextVar("request_id", default=None)


def current() -> str | None:
    """The id of the request being served (None outside one, e.g. in a background task started before)."""
    return _current.get()


def usable(value: bytes) -> bool:
    return 0 < len(value) <= MAX_LENGTH and all(0x21 <= b <= 0x7E for b in value)


def choose(given: bytes | str | None) -> str:
    """The client's id (a header's bytes, or gRPC metadata's text) when usable, else a new one."""
    if isinstance(given, str):
        given = given.encode("utf-8")  # not ASCII: unusable below
    return given.decode("ascii") if given is not None and usable(given) else str(uuid.uuid4())


@contextmanager
def serving(request_id: str) -> Iterator[str]:
    """``request_id`` is the current request's while the block runs (its statistics event reads it)."""
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)


class RequestIds:
    """The ASGI layer: sets the id for the request's context, and adds it to the answer's headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope.get("headers") or [] if name.lower() == HEADER), None)
        request_id = choose(given)
        header = (HEADER, request_id.encode("ascii"))

        async def with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers") or [] if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        with serving(request_id):
            await self.app(scope, receive, with_id)
