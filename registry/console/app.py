"""The console application: sign-in and sign-out, the live-update stream, static files, and the
routers of pages, actions and the playground.

Live updates: each page listens on ``/console/events`` (server-sent events) and reloads its
live regions when the configuration revision moves (the control plane's own broadcaster, as
workers follow it) or, on pages with figures, every few seconds.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.exc import OperationalError

from registry.console.actions import routes as action_routes
from registry.console.chat import routes as chat_routes
from registry.console.api_client import Api, ApiError
from registry.console.pages import routes as page_routes
from registry.console.playground import routes as playground_routes
from registry.console.sessions import COOKIE, SessionBook
from registry.console.stats import Statistics
from registry.console.web import HERE, Console, SignInNeeded, back_to, read_form
from serving.settings import ControlPlaneSettings, WorkerSettings

log = logging.getLogger(__name__)
DATABASE_UNAVAILABLE = ("the registry database is busy or unreachable, so the console cannot read your session or "
                        "anything else: try again in a moment (nothing is lost; you stay signed in)")

KEEPALIVE_S = 15.0
HUMAN_ROLES = ("viewer", "deployer", "admin")


def data_plane_url(settings: ControlPlaneSettings) -> str:
    """Where the playground sends requests: SERVING_CONSOLE_DATA_PLANE_URL, else the local workers."""
    if settings.console_data_plane_url:
        return settings.console_data_plane_url.rstrip("/")
    w = WorkerSettings()
    host = "127.0.0.1" if w.worker_host in ("0.0.0.0", "::", "") else w.worker_host
    return f"http://{host}:{w.worker_port}"


def mount_console(app: FastAPI, settings: ControlPlaneSettings) -> None:
    """Serve the console under ``/console`` of ``app`` (the control plane's API). A mounted
    sub-application, so its pages answer to a session cookie instead of the API's bearer check
    (which covers every route of the API itself)."""
    app.mount("/console", create_console(app, settings))


def create_console(parent: FastAPI, settings: ControlPlaneSettings) -> FastAPI:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["num"] = lambda v, digits=1: "–" if v is None else f"{v:,.{digits}f}"
    console = Console(api=Api(parent), sessions=SessionBook(parent.state.db_sessions), stats=Statistics(settings.resolved_statistics_url(), every_s=settings.console_sample_s),
                      data_plane_url=data_plane_url(settings), broadcaster=parent.state.broadcaster, templates=templates,
                      max_body_bytes=WorkerSettings().max_body_bytes)
    app = FastAPI(title="serving console", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    _errors(app, console)
    _sign_in(app, console)
    _events(app, console)
    for routes in (page_routes, action_routes, playground_routes, chat_routes):
        app.include_router(routes(console))
    return app


def _errors(app: FastAPI, console: Console) -> None:
    @app.exception_handler(SignInNeeded)
    async def sign_in_needed(_request: Request, _exc: SignInNeeded):
        return back_to("/console/signin")

    @app.exception_handler(ApiError)
    async def api_refused(request: Request, exc: ApiError):
        return console.render(request, "error.html", console.known_session(request), status=exc.status,
                              error=exc.detail, page=None)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException):
        if "text/html" not in request.headers.get("accept", ""):
            return await http_exception_handler(request, exc)
        return console.render(request, "error.html", console.known_session(request), status=exc.status_code,
                              error=exc.detail, page=None)

    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, exc: OperationalError):
        """Sessions are read from the database: while it cannot answer, a page says so (503, as the API
        does), and the same page works again once it is back; the session is kept."""
        log.warning("console: database unavailable: %s", exc)
        page = console.render(request, "error.html", None, status=503, error=DATABASE_UNAVAILABLE, page=None)
        page.headers["Retry-After"] = "1"
        return page


def _sign_in(app: FastAPI, console: Console) -> None:
    @app.get("/signin", response_class=HTMLResponse)
    async def sign_in_page(request: Request):
        return console.render(request, "signin.html", None, page="signin")

    @app.post("/signin", response_class=HTMLResponse)
    async def sign_in(request: Request):
        token = (await read_form(request)).get("token", "").strip()
        try:
            who = await console.api.call(token, "GET", "/auth/whoami") if token else None
        except ApiError:
            who = None
        if who is None or who["role"] not in HUMAN_ROLES:
            return console.render(request, "signin.html", None, status=401, page="signin",
                                  error="that token is unknown, revoked or not a person's (viewer, deployer or "
                                        "admin): `serving token create` makes one")
        sid = console.sessions.open(token, who["name"], who["role"])
        resp = back_to("/console/")
        secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/console", secure=secure)
        return resp

    @app.post("/signout")
    async def sign_out(request: Request):
        await console.acting_session(request)
        console.sessions.close(request.cookies.get(COOKIE))
        resp = back_to("/console/signin")
        resp.delete_cookie(COOKIE, path="/console")
        return resp


def _events(app: FastAPI, console: Console) -> None:
    @app.get("/events")
    async def events(request: Request):
        """``config`` with the revision each time it moves; keepalives between."""
        console.session(request)
        broadcaster = console.broadcaster

        async def stream():
            sent = None
            while True:
                revision = broadcaster.snapshot.get("revision")
                if revision != sent:
                    sent = revision
                    yield f"event: config\ndata: {revision}\n\n".encode()
                else:
                    yield b": keepalive\n\n"
                await broadcaster.wait_change(KEEPALIVE_S)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

