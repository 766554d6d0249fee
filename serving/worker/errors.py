"""Errors a worker's client may see: the platform's vocabulary (``serving.errors``), plus what only
the data plane says. Never a 500 with a traceback."""
from __future__ import annotations

from preprocess.base import InputTooLarge, PreprocessError, UserCodeTimeout
from serving.errors import (BadGateway, BadRequest, Forbidden, GatewayTimeout, NotFound, PayloadTooLarge,
                            ServiceError, TooManyRequests, Unauthorized, Unavailable, Unprocessable,
                            UnsupportedMediaType)

ServingError = ServiceError  # the name the worker's modules use

__all__ = ["BadGateway", "BadRequest", "Forbidden", "GatewayTimeout", "ModelNotReady", "NotFound", "TooLarge",
           "PayloadTooLarge", "ServingError", "TooManyRequests", "Unauthorized", "Unavailable", "UnknownEndpoint",
           "Unprocessable", "UnsupportedMediaType", "brief", "user_code_error"]


def brief(message: object, limit: int = 240) -> str:
    """A backend's error as one short line: the exception line of a traceback, never the traceback."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


class UnknownEndpoint(NotFound):
    """No endpoint of that name. The v2 front ends (HTTP and gRPC) word it as Triton does
    (:meth:`as_triton`): Triton's own clients and example scripts check that the message starts with
    Triton's words; the platform's list of endpoints follows them."""

    def __init__(self, name: str, known: str) -> None:
        super().__init__(f"unknown endpoint {name!r} (endpoints: {known})")
        self.name, self.known = name, known

    def as_triton(self) -> NotFound:
        return NotFound(f"Request for unknown model: '{self.name}' is not found (endpoints: {self.known})")


class ModelNotReady(Unavailable):
    """The engine has not loaded this model version yet (a canary just added, Triton restarting)."""


class TooLarge(PayloadTooLarge):
    """More than an encoder endpoint takes (a text past the model's length without truncation, more
    texts than a request may carry): a 413 as TEI answers it; OpenAI's front end words it its way."""


def user_code_error(exc: PreprocessError) -> ServingError:
    """What the client sees when preprocessing failed: its deadline passed (504), more than the endpoint
    takes (413), or it refused the input (422)."""
    if isinstance(exc, UserCodeTimeout):
        return GatewayTimeout(str(exc))
    if isinstance(exc, InputTooLarge):
        return TooLarge(str(exc))
    return Unprocessable(str(exc))
