"""What every console route shares: the signed-in session, the CSRF check, rendering, the API.

Kept apart from the routes so that pages (pages.py), actions (actions.py) and the playground
(playground.py) each hold one job and none imports another.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import parse_qs, quote

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy.exc import OperationalError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from registry.console.api_client import Api
from registry.console.sessions import COOKIE, Session, SessionBook
from registry.console.stats import Statistics

HERE = Path(__file__).parent
MAX_FORM_BYTES = 256 * 1024
REFRESH_HEADER = "x-console-refresh"  # console.js re-reading a page's live regions
DRAIN_BYTES = 64 * 1024**2  # an upload over its limit is read this far (and dropped) so the browser sees why
CSRF_REFUSED = ("this form has no valid CSRF token of a signed-in console session: reload the page and sign in "
                "again")


class SignInNeeded(Exception):
    """A page asked for without a session: answered with a redirect to the sign-in page."""


class UploadTooLarge(Exception):
    """A multipart form past its limit; ``size`` is what was counted (at least that much was sent)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes over a limit of {limit}")
        self.size, self.limit = size, limit


@dataclass(frozen=True)
class Upload:
    """One file of a multipart form, whole in memory (forms are capped, so it is small)."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class Console:
    api: Api
    sessions: SessionBook
    stats: Statistics
    data_plane_url: str
    broadcaster: Any
    templates: Jinja2Templates
    max_body_bytes: int  # the workers' request body limit (SERVING_MAX_BODY_BYTES): the playground's upload cap

    def cookie_session(self, request: Request) -> Session | None:
        """The session the request's cookie names (one read of the database), or None."""
        return self.sessions.get(request.cookies.get(COOKIE))

    def session(self, request: Request) -> Session:
        session = self.cookie_session(request)
        if session is None:
            raise SignInNeeded()
        self.stats.ensure_sampling()
        return session

    async def acting_session(self, request: Request) -> tuple[Session, dict[str, str]]:
        """The session and form of a POST; 403 unless the form returns the session's CSRF token."""
        form = await read_form(request)
        return self.authorised(request, form), form

    async def acting_upload(self, request: Request, limit: int) -> tuple[Session, dict[str, str], dict[str, Upload]]:
        """The session, fields and files of a multipart POST, under the same CSRF rule as every form.
        The cookie's session is checked before the body is read, so nobody signed out gets to make
        the console read a large upload; :class:`UploadTooLarge` past ``limit`` bytes."""
        session = self.authorised(request, None, csrf=False)
        fields, files = await read_upload_form(request, limit)
        return self.authorised(request, fields, session=session), fields, files

    def authorised(self, request: Request, form: dict[str, str] | None, csrf: bool = True,
                   session: Session | None = None) -> Session:
        """The cookie's session (``session``: already read for this request), when the form returns its
        CSRF token (``csrf=False``: the cookie alone, for a check before the form is read); 403 otherwise."""
        session = session or self.cookie_session(request)
        if session is None or (csrf and not session.csrf_ok((form or {}).get("csrf"))):
            raise HTTPException(403, CSRF_REFUSED)
        return session

    def known_session(self, request: Request) -> Session | None:
        """The cookie's session for an error page: None when there is none, or when the database that keeps
        sessions cannot say (the page then explains that, rather than failing itself)."""
        try:
            return self.cookie_session(request)
        except OperationalError:
            return None

    def flash(self, session: Session, text: str, ok: bool = True) -> None:
        """One message shown on the next page the session sees (the result of an action), whichever
        control-plane replica serves that page."""
        self.sessions.set_notice(session, {"text": text, "ok": ok})

    def render(self, request: Request, template: str, session: Session | None, status: int = 200,
               **context: Any) -> HTMLResponse:
        flash = None
        if session is not None and REFRESH_HEADER not in request.headers:  # a live refresh leaves it to the page
            flash = self.sessions.take_notice(session)
        return self.templates.TemplateResponse(request, template, {"session": session, "flash": flash, **context},
                                               status_code=status)


def back_to(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def endpoint_page(name: str) -> str:
    return f"/console/endpoint?name={quote(name, safe='')}"


def api_path(name: str) -> str:
    return quote(name, safe="")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (uploads: read_upload_form): the first value of each field."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise HTTPException(400, "the form is not UTF-8") from exc
    return {k: v[0] for k, v in fields.items()}


async def read_upload_form(request: Request, limit: int) -> tuple[dict[str, str], dict[str, Upload]]:
    """A multipart form of at most ``limit`` bytes: its text fields and its files (the first value
    of each). Read whole before parsing, so the limit holds for a chunked body as for a declared one."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise HTTPException(415, "this form is sent as multipart/form-data (enctype)")
    body = await read_capped(request, limit)

    async def whole() -> AsyncIterator[bytes]:
        yield body

    parser = MultiPartParser(request.headers, whole(), max_files=4, max_fields=16, max_part_size=limit)
    try:
        form = await parser.parse()
    except (MultiPartException, KeyError) as exc:  # KeyError: a content type without its boundary
        raise HTTPException(400, f"the form cannot be read: {getattr(exc, 'message', 'no boundary')}") from None
    fields: dict[str, str] = {}
    files: dict[str, Upload] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            files.setdefault(name, Upload(value.filename or "", value.content_type or "", await value.read()))
        else:
            fields.setdefault(name, value)
    await form.close()
    return fields, files


async def read_capped(request: Request, limit: int) -> bytes:
    """The request's body, or :class:`UploadTooLarge` once it passes ``limit``. An upload over the
    limit is still read to its end and dropped (up to ``DRAIN_BYTES``): a browser still sending when
    the answer comes shows a broken connection, not the answer that says why."""
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0
    stream = request.stream()
    if size > limit:
        raise UploadTooLarge(await _drained(stream, 0) if size <= DRAIN_BYTES else size, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise UploadTooLarge(await _drained(stream, size), limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _drained(stream: AsyncIterator[bytes], size: int) -> int:
    """Read what is left of ``stream`` (up to ``DRAIN_BYTES`` in all) and drop it: the bytes counted."""
    async for chunk in stream:
        size += len(chunk)
        if size > DRAIN_BYTES:
            break
    return size
