"""Registry errors, each with the HTTP status the control plane answers it with."""
from __future__ import annotations


class RegistryError(Exception):
    status = 400


class NotFound(RegistryError):
    status = 404


class Conflict(RegistryError):
    status = 409


class Unprocessable(RegistryError):
    status = 422
