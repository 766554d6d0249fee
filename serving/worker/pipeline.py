"""``Preprocess.send_request``: user code calling other endpoints of the same deployment.

ClearML Serving's pipeline examples call ``self.send_request(endpoint, version, data)``
and get the other endpoint's JSON answer, or None when it failed. Here an endpoint
this worker serves is called in-process, through the same data plane as an HTTP
request (its statistics are recorded like any request's, without a socket or JSON
round trip); any other goes over HTTP to ``pipeline_url`` (the workers' ``/serve``).
The blocking form is for ``custom`` user code running on threads, the coroutine for
``custom_async``.

As in ClearML Serving, ``send_request(endpoint="chat/completions", data={"model": ..., "messages": [...]})``
(or ``"completions"``) calls the LLM endpoint ``data["model"]`` names and returns the OpenAI answer
as a dict (never a stream): in-process through llm/relay.py, or over HTTP to the workers'
``/serve/openai/v1``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from serving.llm.openai.routes import checked, sendable
from serving.llm.relay.generation import split_model

log = logging.getLogger(__name__)


OPENAI_ROUTES = sendable()  # the OpenAI routes send_request takes (serving/llm/openai/routes.py)


def _parse(endpoint: str, version: Any) -> tuple[str, int | None, str]:
    path = endpoint.strip("/")
    if version not in (None, ""):
        path = f"{path}/{str(version).strip('/')}"
    name, _, rest = path.partition("/")
    return name, int(rest) if rest.isdigit() else None, path


class RequestSender:
    def __init__(self, pipeline_url: str, timeout_s: float = 60.0) -> None:
        self.pipeline_url = pipeline_url.rstrip("/")
        self.timeout_s = timeout_s
        self.dataplane: Any = None  # set once the data plane exists (it needs the config this feeds)
        self.generation: Any = None  # its LLM path (llm/relay.py), set with it
        self.loop: asyncio.AbstractEventLoop | None = None  # the worker's event loop, set at start

    async def send(self, endpoint: str, version: Any = None, data: Any = None) -> Any:
        if endpoint.strip("/") in OPENAI_ROUTES:
            return await self._generate(endpoint.strip("/"), data)
        name, pinned, path = _parse(endpoint, version)
        try:
            if self.dataplane is not None and name in self.dataplane.config.current.endpoints:
                return (await self.dataplane.infer(name, data, pinned)).body
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                r = await client.post(f"{self.pipeline_url}/{path}", json=data)
            return r.json() if r.is_success else None
        except Exception as exc:  # ClearML's contract: None on any failure; the caller decides
            log.info("send_request to %s failed: %s", path, exc)
            return None

    async def _generate(self, route: str, data: Any) -> Any:
        try:
            request = {**checked(route, data), "stream": False}
            request.pop("stream_options", None)
            local = self.dataplane.config.current.endpoints if self.dataplane is not None else {}
            if self.generation is not None and split_model(request["model"])[0] in local:
                return (await self.generation.run(route, request)).body
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                r = await client.post(f"{self.pipeline_url}/openai/v1/{route}", json=request)
            return r.json() if r.is_success else None
        except Exception as exc:  # ClearML's contract: None on any failure
            log.info("send_request to %s for model %r failed: %s", route, (data or {}).get("model")
                     if isinstance(data, dict) else None, exc)
            return None

    def send_blocking(self, endpoint: str, version: Any = None, data: Any = None) -> Any:
        """From a user-code thread: run on the worker's loop and wait."""
        if self.loop is None:
            return None
        future = asyncio.run_coroutine_threadsafe(self.send(endpoint, version, data), self.loop)
        try:
            return future.result(self.timeout_s)
        except Exception:
            future.cancel()
            return None

    def for_engine(self, engine: str) -> Any:
        return self.send if engine == "custom_async" else self.send_blocking
