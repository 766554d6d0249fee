"""The playground: one request to the data plane, sent as a client sends it, and its answer.

The console calls the workers' ``POST /serve/{endpoint}`` over HTTP, exactly as a client does,
with the client key the user pastes (never stored) when the endpoint needs one; the page shows
the answer as JSON and the version that gave it (the worker's ``X-Model-Version``). Endpoints
with a tokenizer take text (sent as ``{"text": ...}``), others a JSON body typed as is; LLM
endpoints get a streaming chat instead (chat.py).
"""
from __future__ import annotations

import json
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from registry.console.api_client import ApiError
from registry.console.web import Console
from registry.schemas import LLM_ENGINES

MAX_SHOWN = 20_000  # characters of an answer shown


def takes_text(endpoint: dict) -> bool:
    return (endpoint.get("preprocess") or {}).get("kind") == "tokenizer"


def chats(endpoint: dict | None) -> bool:
    """LLM endpoints get the streaming chat (chat.py) instead of one /serve request."""
    return bool(endpoint) and endpoint.get("engine") in LLM_ENGINES


async def send(data_plane_url: str, endpoint: str, body: dict, key: str) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=60.0) as client:
            resp = await client.post(f"{data_plane_url}/serve/{quote(endpoint, safe='')}", json=body, headers=headers)
    except httpx.HTTPError as exc:
        return {"status": None, "version": None, "answer": f"the data plane at {data_plane_url} did not answer: {exc}"}
    try:
        shown = json.dumps(resp.json(), indent=2)
    except ValueError:
        shown = resp.text
    return {"status": resp.status_code, "version": resp.headers.get("X-Model-Version"), "answer": shown[:MAX_SHOWN]}


def routes(console: Console) -> APIRouter:
    router = APIRouter()

    async def page(request: Request, session, name: str, given: str = "", result: dict | None = None,
                   error: str | None = None, status: int = 200) -> HTMLResponse:
        endpoints = await console.api.call(session.token, "GET", "/endpoints")
        chosen = next((e for e in endpoints if e["name"] == name), endpoints[0] if endpoints else None)
        return console.render(request, "playground.html", session, status=status, endpoints=endpoints, chosen=chosen,
                              text_input=bool(chosen and takes_text(chosen)), chat=chats(chosen), given=given, result=result,
                              error=error, data_plane=console.data_plane_url, page="playground")

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

    return router
