"""Data-plane client keys: created, listed and revoked through the control plane (admin role).

A key (``sk_`` + 256 random bits in hex) is shown once, when created; the registry keeps its
sha256 (hashed as API tokens are, ``auth.hash_token``) with the endpoints it may call (or all)
and optional limits: a rate in requests per second (with its burst) and a budget of tokens per
minute for LLM endpoints (prompt plus completion, charged from each answer's ``usage``). Workers never ask the control plane about a key: every change here
bumps the config revision, and the snapshot carries each live key's name, sha256, endpoints,
rate, burst and tokens per minute (:func:`snapshot_keys`), so a revoked key stops within one config push.
"""
from __future__ import annotations

import math
import re
import secrets
from datetime import datetime, timezone

from fastapi import FastAPI
from pydantic import BaseModel, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.auth import NAME, hash_token
from registry.errors import Conflict, NotFound, Unprocessable
from registry.orm import ClientKey
from registry.service import Registry

KEY_PREFIX = "sk_"
MAX_RATE = 1_000_000.0
MAX_TOKENS_PER_MINUTE = 1_000_000_000
ENDPOINT_NAME = re.compile(r"^[^/\s]{1,128}$")  # what a /serve/{endpoint} path segment can name


def new_key() -> str:
    return KEY_PREFIX + secrets.token_hex(32)


def default_burst(rate: float) -> int:
    """One second's worth of requests, at least one."""
    return max(1, math.ceil(rate))


class ClientKeyCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    endpoints: list[str] | None = Field(None, description="endpoints the key may call; omitted or null: all")
    rate: float | None = Field(None, gt=0, le=MAX_RATE, description="requests per second, per worker process")
    burst: int | None = Field(None, ge=1, le=1_000_000, description="requests allowed at once above the rate")
    tokens_per_minute: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_MINUTE,
                                          description="LLM tokens (prompt + completion) per minute, per worker "
                                                      "process; None: no limit")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("key name: letters, digits, '_', '.', '@', '-' (up to 128)")
        return value

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("endpoints: name at least one, or leave it out for all endpoints")
        bad = [e for e in value if not ENDPOINT_NAME.match(e)]
        if bad:
            raise ValueError(f"endpoints: not an endpoint name: {bad[0]!r}")
        return sorted(set(value))


def key_out(row: ClientKey) -> dict:
    return {"name": row.name, "endpoints": row.endpoints, "rate": row.rate, "burst": row.burst,
            "tokens_per_minute": row.tokens_per_minute, "created_at": row.created_at.isoformat(), "revoked": row.revoked}


def snapshot_keys(s: Session) -> dict[str, dict]:
    """What workers need to check a key, for each key not revoked: never the key itself."""
    rows = s.scalars(select(ClientKey).where(ClientKey.revoked.is_(False)).order_by(ClientKey.name))
    return {r.name: {"sha256": r.key_hash, "endpoints": r.endpoints, "rate": r.rate, "burst": r.burst,
                     "tokens_per_minute": r.tokens_per_minute} for r in rows}


class ClientKeys:
    """Key operations; each one a registry write, so it bumps the revision and pushes a snapshot."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def create(self, req: ClientKeyCreate) -> tuple[ClientKey, str]:
        if req.burst is not None and req.rate is None:
            raise Unprocessable("burst needs a rate (--rate requests per second)")
        key = new_key()
        burst = req.burst if req.burst is not None or req.rate is None else default_burst(req.rate)

        def create(s: Session) -> ClientKey:
            row = s.scalar(select(ClientKey).where(ClientKey.name == req.name))
            if row is not None and not row.revoked:
                raise Conflict(f"a client key named {req.name} exists; revoke it first to replace it")
            if row is None:
                row = ClientKey(name=req.name)
                s.add(row)
            row.key_hash, row.endpoints, row.rate, row.burst = hash_token(key), req.endpoints, req.rate, burst
            row.tokens_per_minute = req.tokens_per_minute
            row.created_at, row.revoked = datetime.now(timezone.utc), False
            s.flush()
            return row

        return self.registry._write(create, f"create client key {req.name}"), key

    def list(self) -> list[ClientKey]:
        with self.registry.sessions() as s:
            return list(s.scalars(select(ClientKey).order_by(ClientKey.id)))

    def revoke(self, name: str) -> None:
        def revoke(s: Session) -> None:
            row = s.scalar(select(ClientKey).where(ClientKey.name == name))
            if row is None:
                raise NotFound(f"no client key named {name}")
            row.revoked = True

        self.registry._write(revoke, f"revoke client key {name}")


def install(app: FastAPI, registry: Registry) -> ClientKeys:
    """The ``/client-keys`` routes (admin only: see ``auth.RULES``)."""
    keys = ClientKeys(registry)

    @app.get("/client-keys")
    def list_keys():
        return [key_out(k) for k in keys.list()]

    @app.post("/client-keys", status_code=201)
    def create_key(req: ClientKeyCreate):
        row, key = keys.create(req)
        return {**key_out(row), "key": key}

    @app.delete("/client-keys/{name}")
    def revoke_key(name: str):
        keys.revoke(name)
        return {"revoked": name}

    return keys
