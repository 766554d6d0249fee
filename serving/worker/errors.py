"""Errors a client may see, each with its HTTP status: never a 500 with a traceback."""
from __future__ import annotations


def brief(message: object, limit: int = 240) -> str:
    """A backend's error as one short line: the exception line of a traceback, never the traceback."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


class ServingError(Exception):
    status = 500

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(ServingError):
    status = 400


class NotFound(ServingError):
    status = 404


class Unauthorized(ServingError):
    """No client key, or one the worker does not know (revoked, mistyped)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": "Bearer"})


class Forbidden(ServingError):
    """A valid client key asking for an endpoint outside its scope."""

    status = 403


class TooManyRequests(ServingError):
    """A client key over its rate."""

    status = 429

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class PayloadTooLarge(ServingError):
    status = 413


class Unprocessable(ServingError):
    status = 422


class BadGateway(ServingError):
    """A dependency answered with an error that is neither the client's fault nor transient."""

    status = 502


class Unavailable(ServingError):
    """A dependency (Triton, a model still loading) is not there now; retrying later will work."""

    status = 503

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class ModelNotReady(Unavailable):
    """The engine has not loaded this model version yet (a canary just added, Triton restarting)."""


class GatewayTimeout(ServingError):
    """User code ran past its endpoint's deadline."""

    status = 504


class UnsupportedMediaType(ServingError):
    status = 415
