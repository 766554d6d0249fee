"""Console sign-in sessions: a random id in an HttpOnly, SameSite=Strict cookie, the API token behind it.

The token a user signs in with stays in this process's memory, never in the browser: the cookie
holds only a random session id. Each session has its own CSRF token, which every form carries
and every POST must return (a page of another site can make the browser send the cookie, not read
the token). Sessions end at sign-out, after ``IDLE_S`` without a request, or with the process
(signing in again is one paste of the token).
"""
from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

COOKIE = "serving_console"
IDLE_S = 8 * 3600.0
MAX_SESSIONS = 10_000  # memory bound: the least recently used goes first


@dataclass
class Session:
    token: str          # the user's API token: every action is made with it
    name: str           # the token's name: the user in the audit log
    role: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = field(default_factory=time.monotonic)
    notice: dict | None = None  # the result of the last action, shown once on the next page

    def can_act(self) -> bool:
        return self.role in ("deployer", "admin")

    def is_admin(self) -> bool:
        return self.role == "admin"

    def csrf_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf.encode())


class SessionBook:
    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, token: str, name: str, role: str) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            if len(self._by_id) >= MAX_SESSIONS:
                oldest = min(self._by_id, key=lambda k: self._by_id[k].seen)
                del self._by_id[oldest]
            self._by_id[sid] = Session(token, name, role)
        return sid

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        now = time.monotonic()
        with self._lock:
            session = self._by_id.get(sid)
            if session is None:
                return None
            if now - session.seen > self.idle_s:
                del self._by_id[sid]
                return None
            session.seen = now
            return session

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)
