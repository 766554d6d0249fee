"""Console sign-in sessions: a random id in an HttpOnly, SameSite=Strict cookie, the API token behind it.

The browser holds only the session id (256 random bits). The sessions live in the database
(table ``console_sessions``), so every control-plane replica behind one Service or gateway knows
every session, and a replica that goes takes none with it (docs/high-availability.md). What the
row holds is derived from the id, never the id itself:

- its key is a hash of the id, so the table cannot be used to sign in;
- the user's API token is sealed (Fernet: AES with an HMAC) under a key derived from the id, so
  only a request carrying the cookie can open it; a copy of the database yields no token;
- the CSRF token every form carries is an HMAC of the id: a page of another site can make the
  browser send the cookie, not read the token.

Sessions end at sign-out or after ``IDLE_S`` without a request. The last time a session was seen
is written at most every ``SEEN_WRITE_S``, so a page load costs one indexed read, not a write.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import sessionmaker

from registry.orm import ConsoleSessionRecord, seconds_of, stamp

COOKIE = "serving_console"
IDLE_S = 8 * 3600.0
SEEN_WRITE_S = 60.0      # how stale the stored last-seen time may grow before a request rewrites it
MAX_SESSIONS = 10_000    # bound on the table: past it, the least recently seen go first
MAX_SID_CHARS = 128      # a cookie longer than any id this module makes is nobody's session


@dataclass
class Session:
    key: str            # the row's key: a hash of the session id
    token: str          # the user's API token: every action is made with it
    name: str           # the token's name: the user in the audit log
    role: str
    csrf: str
    notice: dict | None = None  # the result of the last action, shown once on the next page

    def can_act(self) -> bool:
        return self.role in ("deployer", "admin")

    def is_admin(self) -> bool:
        return self.role == "admin"

    def csrf_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf.encode())


class SessionBook:
    """The sessions, in the database every replica shares. ``clock``: seconds since the epoch."""

    def __init__(self, sessions: sessionmaker, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions, self.idle_s, self.clock = sessions, idle_s, clock

    def open(self, token: str, name: str, role: str) -> str:
        """A new session for ``token`` (already checked by the caller); its id, for the cookie."""
        sid = secrets.token_urlsafe(32)
        now = self.clock()
        with self.sessions.begin() as db:
            self._prune(db, now)
            db.add(ConsoleSessionRecord(key=_row_key(sid), sealed=_fernet(sid).encrypt(token.encode()).decode(),
                                        name=name, role=role, opened_at=stamp(now), seen_at=stamp(now)))
        return sid

    def get(self, sid: str | None) -> Session | None:
        """The cookie's session, or None: no cookie, an unknown or ended session, or one idle too long."""
        if not sid or len(sid) > MAX_SID_CHARS:
            return None
        key, now = _row_key(sid), self.clock()
        with self.sessions.begin() as db:
            row = db.get(ConsoleSessionRecord, key)
            if row is None:
                return None
            idle = now - seconds_of(row.seen_at)
            if idle > self.idle_s:
                db.delete(row)
                return None
            if idle > SEEN_WRITE_S:
                row.seen_at = stamp(now)
            try:
                token = _fernet(sid).decrypt(row.sealed.encode()).decode()
            except InvalidToken:  # not sealed under this id: nobody's session
                return None
            return Session(key=key, token=token, name=row.name, role=row.role, csrf=_csrf(sid), notice=row.notice)

    def close(self, sid: str | None) -> None:
        if sid:
            with self.sessions.begin() as db:
                db.execute(delete(ConsoleSessionRecord).where(ConsoleSessionRecord.key == _row_key(sid)))

    def set_notice(self, session: Session, notice: dict | None) -> None:
        """Keep ``notice`` for the next page this session loads, on whichever replica answers it."""
        session.notice = notice
        with self.sessions.begin() as db:
            db.execute(update(ConsoleSessionRecord).where(ConsoleSessionRecord.key == session.key)
                       .values(notice=notice))

    def take_notice(self, session: Session) -> dict | None:
        """The notice, once: a page that shows it clears it (a write only when there is one)."""
        notice = session.notice
        if notice is not None:
            self.set_notice(session, None)
        return notice

    def _prune(self, db, now: float) -> None:
        """Delete the sessions idle past ``idle_s``, and the least recently seen beyond ``MAX_SESSIONS``."""
        db.execute(delete(ConsoleSessionRecord).where(ConsoleSessionRecord.seen_at < stamp(now - self.idle_s)))
        if db.scalar(select(func.count()).select_from(ConsoleSessionRecord)) >= MAX_SESSIONS:
            kept = (select(ConsoleSessionRecord.key).order_by(ConsoleSessionRecord.seen_at.desc())
                    .limit(MAX_SESSIONS - 1).scalar_subquery())
            db.execute(delete(ConsoleSessionRecord).where(ConsoleSessionRecord.key.not_in(kept)))


def _derive(sid: str, purpose: bytes) -> bytes:
    """32 bytes for one purpose from the session id (HKDF-SHA256: one id, independent keys)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"serving console " + purpose).derive(sid.encode())


def _row_key(sid: str) -> str:
    return hashlib.sha256(_derive(sid, b"row key")).hexdigest()


def _fernet(sid: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(_derive(sid, b"token seal")))


def _csrf(sid: str) -> str:
    return base64.urlsafe_b64encode(_derive(sid, b"csrf")).decode().rstrip("=")

