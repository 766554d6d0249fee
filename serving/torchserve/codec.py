"""What a handler gets and what its answers become: TorchServe's rules, so handlers run unchanged.

TorchServe's frontend turns an HTTP request into named parameters (the raw body as ``body`` with
its content type; each multipart field under its own name, a file with its content type, a plain
field with none), and its Python backend decodes each value by content type: JSON when
``application/json``, text when ``text/*``, bytes otherwise. A handler gets one dict per request.
Its answer for a request is sent as is when bytes, UTF-8 when text, ``torch.save`` bytes when a
tensor, and ``json.dumps(value, indent=2)`` otherwise. These are data classes crossing the pipe
between a worker and its handler processes (pickled), and the rules applied on the handler side.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Parameter:
    name: str
    value: bytes | str | Any  # bytes from HTTP; already decoded JSON when it came through /serve
    content_type: str = ""


@dataclass
class HandlerRequest:
    """One request as TorchServe's frontend hands it to a backend worker."""

    request_id: str
    parameters: list[Parameter]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class HandlerAnswer:
    """One request's answer: its status (200 unless the handler set another), body and headers."""

    status: int = 200
    body: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    message: str = ""  # why, when the status is not 200
    error_type: str = ""  # TorchServe's exception name for the error JSON

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def value(self) -> Any:
        """The answer as JSON for clients of ``/serve`` (and shadow comparison): parsed when it is JSON,
        text when it decodes, else the bytes' length (never the raw bytes in a JSON answer)."""
        try:
            return json.loads(self.body)
        except ValueError:
            pass
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return {"bytes": len(self.body), "content_type": self.content_type or "application/octet-stream"}


def decode_value(param: Parameter) -> Any:
    """A parameter's value as TorchServe's backend decodes it: a ``bytearray`` (as its socket reader gives
    it) unless the content type is exactly ``application/json`` or ``text/...`` and it decodes."""
    value, content_type = param.value, param.content_type or ""
    if not isinstance(value, (bytes, bytearray)):
        return value
    if content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except ValueError:
            return bytearray(value)
    if content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return bytearray(value)
    return bytearray(value)


def handler_input(request: HandlerRequest) -> dict[str, Any]:
    """The dict a handler's ``handle(data, context)`` gets for one request (a later parameter of the
    same name wins, as in TorchServe)."""
    return {p.name: decode_value(p) for p in request.parameters}


def parameter_headers(request: HandlerRequest) -> dict[str, Any]:
    """TorchServe's per-request properties: each parameter's content type, then the request headers."""
    props: dict[str, Any] = {p.name: {"content-type": p.content_type} for p in request.parameters}
    props.update(request.headers)
    return props


def encode_answer(value: Any) -> tuple[bytes, str]:
    """A handler's answer for one request as bytes, and the content type TorchServe gives that kind."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), ""
    if isinstance(value, str):
        return value.encode("utf-8"), ""
    import torch

    if isinstance(value, torch.Tensor):
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue(), ""
    return json.dumps(value, indent=2).encode("utf-8"), ""  # TorchServe sends no content type for these either
