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


class Unauthorized(ServiceError):
    """No credential, or one that is not known (revoked, mistyped)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": "Bearer"})


# The other kinds, one a line: the class, its HTTP status, and when it is the right one.
class BadRequest(ServiceError): status = 400  # noqa: E701
class Forbidden(ServiceError): status = 403  # noqa: E701  a valid credential, outside its scope
class NotFound(ServiceError): status = 404  # noqa: E701
class Conflict(ServiceError): status = 409  # noqa: E701  contradicts what is stored (a name taken)
class PayloadTooLarge(ServiceError): status = 413  # noqa: E701
class UnsupportedMediaType(ServiceError): status = 415  # noqa: E701
class Unprocessable(ServiceError): status = 422  # noqa: E701  well-formed, but not for this endpoint or model
class BadGateway(ServiceError): status = 502  # noqa: E701  a dependency's error: not the client's, not transient
class GatewayTimeout(ServiceError): status = 504  # noqa: E701  work past its deadline (user code)
class TooManyRequests(_RetryLater): status = 429  # noqa: E701  over a rate
class Unavailable(_RetryLater): status = 503  # noqa: E701  a dependency away for now (Triton, a loading model)
