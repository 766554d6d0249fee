"""Registry errors: the platform's vocabulary (``serving.errors``), each answered with its HTTP status."""
from __future__ import annotations

from serving.errors import BadRequest, Conflict, NotFound, ServiceError, Unprocessable

RegistryError = ServiceError  # what the control plane's handler catches: any of them

__all__ = ["BadRequest", "Conflict", "NotFound", "RegistryError", "Unprocessable"]
