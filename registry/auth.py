"""Who may call the control plane: hashed API tokens with roles, checked on every route.

Roles (see docs/security.md):

* ``viewer``: reads (models, endpoints, config, artifacts, audit log);
* ``deployer``: also uploads and changes endpoints, canaries, metrics, rollouts;
* ``admin``: also deletes models and endpoints and manages tokens and data-plane client keys;
* ``worker``: the config stream (``/config``, ``/config/stream``) and artifact downloads only,
  and ``/auth/whoami`` (the statistics service validates tokens through it).

Rules are looked up by method and route template; a route nobody listed (one added later)
gets the default for its method: reads need a human role, changes need deployer. Only
``/health``, ``/leadership`` (whether this replica leads: a sidecar asks it) and the API description
(``/openapi.json``, ``/docs``) are open.

Tokens are random (``srv_`` + 256 bits), shown once, stored as their sha256. Bootstrap tokens
come from ``SERVING_ADMIN_TOKEN`` / ``SERVING_WORKER_TOKEN`` or, when those are unset, from
``$SERVING_HOME/tokens/{admin,worker}`` (created 0600 on first start); they are registered
under the names ``bootstrap-admin`` / ``bootstrap-worker`` at every start.
"""
from __future__ import annotations

import hmac
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from registry.orm import ApiToken, AuditEntry
from serving.credentials import ensure_token_file, new_token, secret_sha256
from serving.settings import ControlPlaneSettings

log = logging.getLogger(__name__)

ROLES = ("admin", "deployer", "viewer", "worker")
READERS = frozenset({"viewer", "deployer", "admin"})
CHANGERS = frozenset({"deployer", "admin"})
ADMINS = frozenset({"admin"})
CONFIG_READERS = READERS | {"worker"}
ANY = frozenset(ROLES)

PUBLIC = frozenset({"/health", "/leadership", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
# (method, route template) -> roles allowed; anything not listed: DEFAULTS by method
RULES: dict[tuple[str, str], frozenset[str]] = {
    ("GET", "/config"): CONFIG_READERS,
    ("GET", "/config/stream"): CONFIG_READERS,
    ("GET", "/artifacts/{sha256}"): CONFIG_READERS,
    ("GET", "/auth/whoami"): ANY,
    ("POST", "/readiness"): frozenset({"worker", "admin"}),  # workers' readiness reports (registry/readiness.py)
    ("DELETE", "/models/{name}"): ADMINS,
    ("DELETE", "/endpoints/{name}"): ADMINS,
    ("GET", "/tokens"): ADMINS,
    ("POST", "/tokens"): ADMINS,
    ("DELETE", "/tokens/{name}"): ADMINS,
    ("GET", "/client-keys"): ADMINS,
    ("POST", "/client-keys"): ADMINS,
    ("DELETE", "/client-keys/{name}"): ADMINS,
    ("GET", "/audit"): READERS,
}
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PRINCIPAL_KEY = "serving.principal"  # request.scope key the audit log reads
TOUCH_EVERY_S = 60.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")


hash_token = secret_sha256  # one hashing for tokens and client keys (serving/credentials.py)


CONVERTER = re.compile(r"\{(\w+):\w+\}")  # "{name:path}" -> "{name}": a rule names the parameter only


def allowed_roles(method: str, path: str) -> frozenset[str]:
    """``path``: the route's template, its converters taken out (``authorize`` does that once)."""
    rule = RULES.get((method, path))
    if rule is not None:
        return rule
    return READERS if method in READ_METHODS else CHANGERS


def _describe(roles: frozenset[str]) -> str:
    order = [r for r in ("viewer", "deployer", "admin", "worker") if r in roles]
    return " or ".join(order)


@dataclass(frozen=True)
class Principal:
    id: int
    name: str
    role: str
    upload_quota_bytes: int | None = None
    uploaded_bytes: int = 0


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    role: str
    upload_quota_bytes: int | None = Field(None, ge=0, le=2**62)


class TokenStore:
    def __init__(self, sessions: sessionmaker) -> None:
        self.sessions = sessions
        self._touched: dict[int, float] = {}

    def create(self, name: str, role: str, quota: int | None = None, token: str | None = None) -> tuple[ApiToken, str]:
        if role not in ROLES:
            raise HTTPException(422, f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if not NAME.match(name):
            raise HTTPException(422, "token name: letters, digits, '_', '.', '@', '-' (up to 128)")
        token = token or new_token()
        row = ApiToken(name=name, role=role, token_hash=hash_token(token), upload_quota_bytes=quota,
                       uploaded_bytes=0, revoked=False, created_at=datetime.now(timezone.utc))
        with self.sessions() as s:
            if s.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
                raise HTTPException(409, f"a token named {name} exists; revoke it or pick another name")
            s.add(row)
            try:
                s.commit()
            except IntegrityError as exc:
                raise HTTPException(409, f"a token named {name} exists") from exc
        return row, token

    def ensure(self, name: str, role: str, token: str) -> None:
        """Register a bootstrap token under ``name`` (replacing its hash, un-revoking it)."""
        digest = hash_token(token)
        with self.sessions() as s:
            row = s.scalar(select(ApiToken).where(ApiToken.name == name))
            other = s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
            if other is not None and other is not row:
                log.warning("bootstrap token %s is already registered as %s; leaving it", name, other.name)
                return
            if row is None:
                s.add(ApiToken(name=name, role=role, token_hash=digest, revoked=False, uploaded_bytes=0,
                               created_at=datetime.now(timezone.utc)))
            else:
                row.role, row.token_hash, row.revoked = role, digest, False
            try:
                s.commit()
            except IntegrityError:  # another replica registered it at the same moment
                s.rollback()

    def list(self) -> list[ApiToken]:
        with self.sessions() as s:
            return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))

    def revoke(self, name: str) -> None:
        with self.sessions() as s:
            if s.execute(update(ApiToken).where(ApiToken.name == name).values(revoked=True)).rowcount == 0:
                raise HTTPException(404, f"no token named {name}")
            s.commit()

    def lookup(self, token: str) -> Principal | None:
        digest = hash_token(token)
        with self.sessions() as s:
            row = s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
            if row is None or row.revoked or not hmac.compare_digest(row.token_hash, digest):
                return None
            principal = Principal(row.id, row.name, row.role, row.upload_quota_bytes, row.uploaded_bytes or 0)
        self._touch(principal.id)
        return principal

    def _touch(self, token_id: int) -> None:
        now = time.monotonic()
        if now - self._touched.get(token_id, -TOUCH_EVERY_S) < TOUCH_EVERY_S:
            return
        self._touched[token_id] = now
        try:
            with self.sessions() as s:
                s.execute(update(ApiToken).where(ApiToken.id == token_id)
                          .values(last_used_at=datetime.now(timezone.utc)))
                s.commit()
        except Exception as exc:  # bookkeeping only: never fail a request for it
            log.debug("last_used_at not updated: %s", exc)

    def charge_upload(self, token_id: int, size: int) -> bool:
        """Count ``size`` uploaded bytes against the token's quota; False (nothing counted) past it."""
        with self.sessions() as s:
            quota_ok = (ApiToken.upload_quota_bytes.is_(None)
                        | (ApiToken.uploaded_bytes + size <= ApiToken.upload_quota_bytes))
            done = s.execute(update(ApiToken).where(ApiToken.id == token_id, quota_ok)
                             .values(uploaded_bytes=ApiToken.uploaded_bytes + size)).rowcount
            s.commit()
        return done == 1


def token_out(row: ApiToken) -> dict:
    return {"name": row.name, "role": row.role, "created_at": row.created_at.isoformat(),
            "last_used_at": row.last_used_at.isoformat() if row.last_used_at else None,
            "revoked": row.revoked, "upload_quota_bytes": row.upload_quota_bytes,
            "uploaded_bytes": row.uploaded_bytes or 0}


bearer = HTTPBearer(auto_error=False, description="an API token: `serving token create` or $SERVING_HOME/tokens/admin")


def install(app: FastAPI, sessions: sessionmaker, settings: ControlPlaneSettings) -> TokenStore:
    """Check a bearer token on every route added after this call; bootstrap tokens; token routes."""
    tokens = TokenStore(sessions)
    bootstrap(tokens, settings)

    def authorize(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        route = request.scope.get("route")
        path = CONVERTER.sub(r"{\1}", getattr(route, "path", request.url.path))
        if path in PUBLIC:
            return
        if creds is None or not creds.credentials:
            raise HTTPException(401, "authentication required: send 'Authorization: Bearer <token>' "
                                     "(serving login, SERVING_TOKEN)", headers={"WWW-Authenticate": "Bearer"})
        principal = tokens.lookup(creds.credentials)
        if principal is None:
            raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
        request.scope[PRINCIPAL_KEY] = principal
        roles = allowed_roles(request.method, path)
        if principal.role not in roles:
            raise HTTPException(403, f"token {principal.name} has role {principal.role}; "
                                     f"{request.method} {path} needs role {_describe(roles)}")

    app.router.dependencies.append(Depends(authorize))
    app.state.tokens = tokens
    _openapi_public(app)
    _token_routes(app, tokens, sessions)
    return tokens


def bootstrap(tokens: TokenStore, settings: ControlPlaneSettings) -> None:
    for role, given in (("admin", settings.admin_token), ("worker", settings.worker_token)):
        if given:
            token, where = given, f"SERVING_{role.upper()}_TOKEN"
        else:
            token, path = ensure_token_file(settings.home, role)
            where = str(path)
        tokens.ensure(f"bootstrap-{role}", role, token)
        log.info("%s token: %s", role, where)


def principal_of(request: Request) -> Principal | None:
    return request.scope.get(PRINCIPAL_KEY)


async def receive_upload(request: Request, store) -> tuple[str, int]:
    """Stream an upload into the artifact store within the size limit and the token's quota.

    Past either: 413 naming which, and the temp file is gone (``put_stream`` removes it). The
    bytes are counted against the quota once stored, atomically, so concurrent uploads of one
    token cannot together pass it either."""
    from starlette.concurrency import run_in_threadpool

    principal = principal_of(request)
    limit = request.app.state.max_artifact_bytes
    quota_left = None
    if principal is not None and principal.upload_quota_bytes is not None:
        quota_left = max(0, principal.upload_quota_bytes - principal.uploaded_bytes)
    cap = limit if quota_left is None else min(limit, quota_left)

    def refused() -> HTTPException:
        if quota_left is not None and quota_left < limit:
            return HTTPException(413, f"upload quota of token {principal.name} exceeded: "
                                      f"{principal.uploaded_bytes} of {principal.upload_quota_bytes} bytes used")
        return HTTPException(413, f"artifact larger than the limit of {limit} bytes (SERVING_MAX_ARTIFACT_BYTES)")

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise refused()
    try:
        sha, size = await store.put_stream(request.stream(), max_bytes=cap)
    except ValueError as exc:
        raise refused() from exc
    tokens: TokenStore = request.app.state.tokens
    if principal is not None and not await run_in_threadpool(tokens.charge_upload, principal.id, size):
        raise refused()
    return sha, size


def _token_routes(app: FastAPI, tokens: TokenStore, sessions: sessionmaker) -> None:
    @app.get("/auth/whoami")
    def whoami(request: Request):
        p = principal_of(request)
        return {"name": p.name, "role": p.role}

    @app.get("/tokens")
    def list_tokens():
        return [token_out(t) for t in tokens.list()]

    @app.post("/tokens", status_code=201)
    def create_token(req: TokenCreate):
        row, token = tokens.create(req.name, req.role, req.upload_quota_bytes)
        return {**token_out(row), "token": token}

    @app.delete("/tokens/{name}")
    def revoke_token(name: str):
        tokens.revoke(name)
        return {"revoked": name}

    @app.get("/audit")
    def audit(limit: int = Query(100, ge=1, le=10_000)):
        with sessions() as s:
            rows = list(s.scalars(select(AuditEntry).order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(limit)))
        return [{"at": r.at.isoformat(), "actor": r.actor, "action": r.action, "target": r.target,
                 "detail": r.detail} for r in rows]


def _openapi_public(app: FastAPI) -> None:
    """The generated document marks every operation with the bearer scheme; open ones say none."""
    original = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        for path, ops in schema.get("paths", {}).items():
            if path in PUBLIC:
                for op in ops.values():
                    if isinstance(op, dict):
                        op["security"] = []
        return schema

    app.openapi = openapi
