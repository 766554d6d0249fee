"""The playground: one request to the data plane, sent as a client sends it, and its answer.

The console calls the workers over HTTP exactly as a client does, with the client key the user
pastes (never stored) when the endpoint needs one; the page shows the answer and the version that
gave it (the worker's ``X-Model-Version``). Endpoints with a tokenizer take text (sent to
``POST /serve/{endpoint}`` as ``{"text": ...}``), others a JSON body typed as is; LLM endpoints get
a streaming chat instead (chat.py).

TorchServe archives' endpoints (preprocess kind ``handler``) take a file (an image, or anything
their handler reads) or a typed body, sent as TorchServe's own clients send it: the raw bytes with
their content type in a ``PUT /predictions/{endpoint}``, what ``curl -T FILE`` does. The browser
posts them in a multipart form (``/console/playground/upload``) under the same session and CSRF
rules as every form, capped at the workers' body limit so that a file they would refuse is
refused here first, in words that say why.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from registry.console.api_client import ApiError
from registry.console.web import MAX_FORM_BYTES, Console, Upload, UploadTooLarge
from registry.schemas import LLM_ENGINES

MAX_SHOWN = 20_000  # characters of an answer shown
FILE_FIELD = "file"
BINARY_TYPES = ("image/", "audio/", "video/", "application/octet-stream")  # answers summarised, not printed


@dataclass(frozen=True)
class RawBody:
    """What goes to ``/predictions``: the bytes, their content type, and where they came from."""

    data: bytes
    content_type: str
    source: str  # the file's name, or "the text box"


def takes_text(endpoint: dict) -> bool:
    return (endpoint.get("preprocess") or {}).get("kind") == "tokenizer"


def takes_file(endpoint: dict | None) -> bool:
    """TorchServe archives' endpoints: their handler reads the raw request (preprocess/handler.py)."""
    return bool(endpoint) and (endpoint.get("preprocess") or {}).get("kind") == "handler"


def chats(endpoint: dict | None) -> bool:
    """LLM endpoints get the streaming chat (chat.py) instead of one /serve request."""
    return bool(endpoint) and endpoint.get("engine") in LLM_ENGINES


def size_words(n: int) -> str:
    """A byte count as people read it, exact first: ``1,048,576 bytes (1 MiB)``."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n:,} bytes ({n / size:.3g} {unit})"
    return f"{n:,} bytes"


def readable(content: bytes, content_type: str) -> str:
    """An answer as the page shows it: JSON pretty-printed, else text, else its size and type
    (an image a handler answers is not printed as mojibake)."""
    if not content:
        return "(an empty body)"
    try:
        return json.dumps(json.loads(content), indent=2)[:MAX_SHOWN]
    except ValueError:
        pass
    mime = content_type.split(";", 1)[0].strip().lower()
    if not mime.startswith(BINARY_TYPES) and b"\0" not in content:
        try:
            return content.decode("utf-8")[:MAX_SHOWN]
        except UnicodeDecodeError:
            pass
    return f"{len(content):,} bytes of {mime or 'an unnamed content type'}"


def raw_body(files: dict[str, Upload], typed: str) -> RawBody | None:
    """The file when one was chosen (a browser sends an empty, nameless part when none was), else
    the text box: as application/json when it is JSON (TorchServe hands the handler the decoded
    value), else as UTF-8 text; None when both are empty."""
    upload = files.get(FILE_FIELD)
    if upload is not None and (upload.filename or upload.data):
        return RawBody(upload.data, upload.content_type or "application/octet-stream", upload.filename or "the file")
    if not typed:
        return None
    try:
        json.loads(typed)
        content_type = "application/json"
    except ValueError:
        content_type = "text/plain; charset=utf-8"
    return RawBody(typed.encode("utf-8"), content_type, "the text box")


async def answered(data_plane_url: str, method: str, path: str, key: str, **request: Any) -> dict:
    """One request to the data plane, and its answer as the page shows it."""
    headers = {**request.pop("headers", {}), **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        async with httpx.AsyncClient(timeout=60.0) as client:
            resp = await client.request(method, f"{data_plane_url}{path}", headers=headers, **request)
    except httpx.HTTPError as exc:
        return {"status": None, "version": None, "answer": f"the data plane at {data_plane_url} did not answer: {exc}"}
    return {"status": resp.status_code, "version": resp.headers.get("X-Model-Version"),
            "answer": readable(resp.content, resp.headers.get("content-type", ""))}


async def send(data_plane_url: str, endpoint: str, body: dict, key: str) -> dict:
    return await answered(data_plane_url, "POST", f"/serve/{quote(endpoint, safe='')}", key, json=body)


async def put_raw(data_plane_url: str, endpoint: str, body: RawBody, key: str) -> dict:
    """``curl -T FILE`` of TorchServe's inference API: a PUT of the raw bytes with their type."""
    path = f"/predictions/{quote(endpoint, safe='')}"
    result = await answered(data_plane_url, "PUT", path, key, content=body.data,
                            headers={"Content-Type": body.content_type})
    return {**result, "sent": {"request": f"PUT {path}",
                               "what": f"{len(body.data):,} bytes of {body.content_type} from {body.source}"}}


def too_large(what: str, size: int, limit: int) -> str:
    return (f"{what} is {size_words(size)}; the workers take a request body of at most {size_words(limit)} "
            "(SERVING_MAX_BODY_BYTES): choose a smaller file")


def routes(console: Console) -> APIRouter:
    router = APIRouter()

    async def page(request: Request, session, name: str, given: str = "", result: dict | None = None,
                   error: str | None = None, status: int = 200) -> HTMLResponse:
        endpoints = await console.api.call(session.token, "GET", "/endpoints")
        chosen = next((e for e in endpoints if e["name"] == name), endpoints[0] if endpoints else None)
        return console.render(request, "playground.html", session, status=status, endpoints=endpoints, chosen=chosen,
                              text_input=bool(chosen and takes_text(chosen)), file_input=takes_file(chosen),
                              chat=chats(chosen), given=given, result=result, error=error,
                              max_body=size_words(console.max_body_bytes), data_plane=console.data_plane_url,
                              page="playground")

    @router.get("/playground", response_class=HTMLResponse)
    async def playground(request: Request, endpoint: str = ""):
        return await page(request, console.session(request), endpoint)

    @router.post("/playground", response_class=HTMLResponse)
    async def call(request: Request):
        session, form = await console.acting_session(request)
        name, given = form.get("endpoint", ""), form.get("input", "")
        try:
            ep = await console.api.call(session.token, "GET", f"/endpoints/{quote(name, safe='')}")
        except ApiError as exc:
            return await page(request, session, name, given, error=exc.detail, status=exc.status)
        if takes_text(ep):
            body = {"text": given}
        else:
            try:
                body = json.loads(given)
            except ValueError as exc:
                return await page(request, session, name, given, status=422,
                                  error=f"the request body is not JSON: {exc}")
        result = await send(console.data_plane_url, name, body, form.get("key", "").strip())
        return await page(request, session, name, given, result=result)

    @router.post("/playground/upload", response_class=HTMLResponse)
    async def upload(request: Request, endpoint: str = ""):
        """A TorchServe endpoint's file or typed body (the endpoint is in the query string, so that
        an upload too large to read still comes back to its own endpoint's page)."""
        limit = console.max_body_bytes
        try:
            session, form, files = await console.acting_upload(request, limit + MAX_FORM_BYTES)
        except UploadTooLarge as exc:
            session = console.authorised(request, None, csrf=False)
            return await page(request, session, endpoint, status=413,
                              error=too_large("the upload", exc.size, limit))
        given = form.get("input", "")
        try:
            ep = await console.api.call(session.token, "GET", f"/endpoints/{quote(endpoint, safe='')}")
        except ApiError as exc:
            return await page(request, session, endpoint, given, error=exc.detail, status=exc.status)
        if not takes_file(ep):
            return await page(request, session, endpoint, given, status=422,
                              error=f"{endpoint} is not a TorchServe archive's endpoint: send it JSON at /serve")
        body = raw_body(files, given)
        if body is None:
            return await page(request, session, endpoint, given, status=422,
                              error="choose a file, or type a body in the text box")
        if len(body.data) > limit:
            return await page(request, session, endpoint, given, status=413,
                              error=too_large(body.source, len(body.data), limit))
        result = await put_raw(console.data_plane_url, endpoint, body, form.get("key", "").strip())
        return await page(request, session, endpoint, given, result=result)

    return router
