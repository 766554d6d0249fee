"""The platform's one error vocabulary: what a client may be told, by any service.

The control plane and the workers (and any front end: JSON over HTTP, gRPC status codes) raise
these and translate them at their edge, so a status means the same thing everywhere. An error
carries its HTTP status, a message in words naming what is wrong, and, where waiting helps, a
retry hint (``Retry-After``). It lives here, beside ``serving.settings``, so the registry can use
it without depending on the worker's internals, and the worker without depending on the registry.
"""
from __future__ import annotations


class ServiceError(Exception):
    status = 500

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    @property
    def retry_after_s(self) -> int | None:
        retry = self.headers.get("Retry-After")
        return int(retry) if retry else None


class _RetryLater(ServiceError):
    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    """No credential, or one that is not known (revoked, mistyped)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    """A valid credential asking for something outside its scope."""

    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class PayloadTooLarge(ServiceError):
    status = 413


class UnsupportedMediaType(ServiceError):
    status = 415


class Unprocessable(ServiceError):
    status = 422


class TooManyRequests(_RetryLater):
    """Over a rate."""

    status = 429


class BadGateway(ServiceError):
    """A dependency answered with an error that is neither the client's fault nor transient."""

    status = 502


class Unavailable(_RetryLater):
    """A dependency (Triton, a model still loading, the database) is not there now; retrying later will work."""

    status = 503


class GatewayTimeout(ServiceError):
    """Work ran past its deadline."""

    status = 504
