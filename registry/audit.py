"""The audit log: every change made through the control plane, with who, what and when.

A pure ASGI middleware (so the SSE config stream and artifact uploads stream through it
untouched) watches each request that is not a read: once the route answered, it writes one
``audit_log`` row with the token's name (``actor``), ``"<METHOD> <route template>"``
(``action``), the object changed (``target``: the path parameters, else the body's endpoint or
name) and a short ``detail`` (status, query, the body's scalar fields cut to 200 characters, and
``sha256``/``size``/``version`` of the answer). Refusals of a known token (403) are recorded
too; anonymous 401s are not (they would let anyone fill the table). Secrets never enter it:
the answer's ``token`` field is never read.
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool

from registry.auth import PRINCIPAL_KEY, READ_METHODS
from registry.orm import AuditEntry

log = logging.getLogger(__name__)

BODY_KEEP = 4096      # bytes of a JSON request/answer body looked at
FIELD_CHARS = 200     # longest scalar kept in detail
ANSWER_KEYS = ("sha256", "size", "version", "name", "role", "removed", "revision")
SECRET_KEYS = {"token", "password", "secret"}
UNAUDITED = frozenset({"/readiness"})  # workers' heartbeats: state reports, not changes
TARGET_KEY = "serving.audit_target"  # request.scope key: what a route changed, when no path parameter names it


def _scalars(doc: Any) -> dict:
    if not isinstance(doc, dict):
        return {}
    out = {}
    for k, v in doc.items():
        if k.lower() in SECRET_KEYS:
            continue
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v[:FIELD_CHARS] if isinstance(v, str) else v
        elif isinstance(v, (list, dict)):
            text = json.dumps(v, default=str)
            out[k] = text if len(text) <= FIELD_CHARS else text[:FIELD_CHARS] + "..."
    return out


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data and len(data) < BODY_KEEP else None
    except ValueError:
        return None


class AuditMiddleware:
    def __init__(self, app, sessions: sessionmaker, prefix: str = "") -> None:
        self.app, self.sessions = app, sessions
        self.prefix = prefix  # another API's routes (TorchServe's management API): its name before each template

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in READ_METHODS or scope.get("path") in UNAUDITED:
            return await self.app(scope, receive, send)
        asked_at = datetime.now(timezone.utc)  # the entry's time: when it was asked (entries are written
        # after their answers, on a thread each, so two quick requests' writes may land in either order)
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        watch_body = "json" in headers.get("content-type", "")
        request_body, answer_body, status = bytearray(), bytearray(), [0]

        async def receive_wrapper():
            message = await receive()
            if watch_body and message["type"] == "http.request" and len(request_body) < BODY_KEEP:
                request_body.extend(message.get("body", b"")[:BODY_KEEP])
            return message

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and len(answer_body) < BODY_KEEP:
                answer_body.extend(message.get("body", b"")[:BODY_KEEP])
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            principal = scope.get(PRINCIPAL_KEY)
            if principal is not None and (status[0] < 400 or status[0] == 403):
                entry = self._entry(scope, principal.name, status[0], bytes(request_body), bytes(answer_body),
                                    self.prefix)
                try:
                    await run_in_threadpool(self._write, entry, asked_at)
                except Exception:
                    log.exception("audit entry not written: %s", entry)

    @staticmethod
    def _entry(scope, actor: str, status: int, body: bytes, answer: bytes, prefix: str = "") -> dict:
        route = scope.get("route")
        template = getattr(route, "path", scope.get("path", ""))
        params = scope.get("path_params") or {}
        doc = _scalars(_json(body))
        target = ("/".join(str(v) for v in params.values()) or str(scope.get(TARGET_KEY) or "")
                  or str(doc.get("endpoint") or doc.get("name") or ""))
        detail: dict[str, Any] = {"status": status}
        if scope.get("query_string"):
            detail["query"] = scope["query_string"].decode("latin-1")[:FIELD_CHARS]
        if doc:
            detail["body"] = doc
        result = _json(answer)
        if isinstance(result, dict):
            kept = {k: result[k] for k in ANSWER_KEYS if k in result and not isinstance(result[k], (dict, list))}
            if kept:
                detail["result"] = kept
        if status == 403:
            detail["denied"] = True
        action = f"{scope['method']} {prefix}{template}"
        return {"actor": actor, "action": action[:64], "target": target[:256], "detail": detail}

    def _write(self, entry: dict, at: datetime) -> None:
        for attempt in range(20):
            try:
                with self.sessions() as s:
                    s.add(AuditEntry(at=at, **entry))
                    s.commit()
                return
            except OperationalError:  # SQLite's write lock busy under concurrent changes
                if attempt == 19:
                    raise
                time.sleep(0.05 * (attempt + 1))


def install(app, sessions: sessionmaker, prefix: str = "") -> None:
    app.add_middleware(AuditMiddleware, sessions=sessions, prefix=prefix)
