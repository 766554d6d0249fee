"""What every console route shares: the signed-in session, the CSRF check, rendering, the API.

Kept apart from the routes so that pages (pages.py), actions (actions.py) and the playground
(playground.py) each hold one job and none imports another.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from registry.console.api_client import Api
from registry.console.sessions import COOKIE, Session, SessionBook
from registry.console.stats import Statistics

HERE = Path(__file__).parent
MAX_FORM_BYTES = 256 * 1024
REFRESH_HEADER = "x-console-refresh"  # console.js re-reading a page's live regions


class SignInNeeded(Exception):
    """A page asked for without a session: answered with a redirect to the sign-in page."""


@dataclass
class Console:
    api: Api
    sessions: SessionBook
    stats: Statistics
    data_plane_url: str
    broadcaster: Any
    templates: Jinja2Templates

    def session(self, request: Request) -> Session:
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise SignInNeeded()
        self.stats.ensure_sampling()
        return session

    async def acting_session(self, request: Request) -> tuple[Session, dict[str, str]]:
        """The session and form of a POST; 403 unless the form returns the session's CSRF token."""
        form = await read_form(request)
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None or not session.csrf_ok(form.get("csrf")):
            raise HTTPException(403, "this form has no valid CSRF token of a signed-in console session: "
                                     "reload the page and sign in again")
        return session, form

    def render(self, request: Request, template: str, session: Session | None, status: int = 200,
               **context: Any) -> HTMLResponse:
        flash = None
        if session is not None and REFRESH_HEADER not in request.headers:  # a live refresh leaves it to the page
            flash, session.notice = session.notice, None
        return self.templates.TemplateResponse(request, template, {"session": session, "flash": flash, **context},
                                               status_code=status)


def flash(session: Session, text: str, ok: bool = True) -> None:
    """One message shown on the next page the session sees (the result of an action)."""
    session.notice = {"text": text, "ok": ok}


def back_to(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def endpoint_page(name: str) -> str:
    return f"/console/endpoint?name={quote(name, safe='')}"


def api_path(name: str) -> str:
    return quote(name, safe="")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (no multipart parser needed): the first value of each field."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise HTTPException(400, "the form is not UTF-8") from exc
    return {k: v[0] for k, v in fields.items()}
