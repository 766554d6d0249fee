"""The playground's streaming chat for LLM endpoints (engine vllm): the console relays the workers'
OpenAI stream to the page as it comes.

The page posts the conversation (with the session's CSRF token and the client key the user typed,
never stored) to ``/console/playground/chat``; the console sends it as a client does, an OpenAI
chat request with ``stream: true`` to the data plane's ``/serve/openai/v1/chat/completions``, and
passes the answer's server-sent events through untouched, chunk by chunk (nothing buffered: the
page shows each token as it arrives, console.js), with the worker's status and ``X-Model-Version``.
Relayed rather than called from the page: the workers are another origin (no CORS there) and the
console's session, not the browser, is what is signed in.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from registry.console.web import Console

CHAT_PATH = "/serve/openai/v1/chat/completions"
MAX_TOKENS = 4096
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def chat_request(form: dict[str, str]) -> dict[str, Any]:
    """The OpenAI request a form asks for; 422 naming the field that is wrong."""
    try:
        messages = json.loads(form.get("messages") or "[]")
    except ValueError:
        raise HTTPException(422, "messages: a JSON list of {role, content}") from None
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise HTTPException(422, "messages: a non-empty JSON list of {role, content}")
    try:
        max_tokens = int(form.get("max_tokens") or 64)
        temperature = float(form.get("temperature") or 0)
    except ValueError:
        raise HTTPException(422, "max_tokens and temperature: numbers") from None
    if not 1 <= max_tokens <= MAX_TOKENS:
        raise HTTPException(422, f"max_tokens: between 1 and {MAX_TOKENS}")
    return {"model": form.get("endpoint", ""), "messages": messages, "stream": True,
            "max_tokens": max_tokens, "temperature": temperature}


def routes(console: Console) -> APIRouter:
    router = APIRouter()

    @router.post("/playground/chat")
    async def chat(request: Request):
        _session, form = await console.acting_session(request)
        body = chat_request(form)
        key = form.get("key", "").strip()
        client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=300.0))
        outgoing = client.build_request("POST", f"{console.data_plane_url}{CHAT_PATH}", json=body,
                                        headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            answer = await client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            return JSONResponse({"error": {"message": f"the data plane at {console.data_plane_url} did not answer: "
                                                      f"{type(exc).__name__}"}}, status_code=502)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_bytes():
                    yield chunk
            finally:
                await answer.aclose()
                await client.aclose()

        headers = dict(STREAM_HEADERS)
        if answer.headers.get("x-model-version"):
            headers["X-Model-Version"] = answer.headers["x-model-version"]
        return StreamingResponse(relay(), status_code=answer.status_code, headers=headers,
                                 media_type=answer.headers.get("content-type", "text/event-stream"))

    return router
