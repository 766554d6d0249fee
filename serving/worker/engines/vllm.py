"""Engine ``vllm``: generation runs in vLLM's own OpenAI server, a process apart; the worker is its client.

The worker keeps what it does for every endpoint (routing, keys, preprocess, statistics:
serving/worker/generation.py) and forwards the OpenAI request over HTTP (aiohttp, one pooled session
per worker process: its C parser costs a streamed token about half the CPU httpx's stack did,
measured in docs/benchmarks.md). Where a version's engine is:

- external: the endpoint's ``engine_options["url"]`` (an OpenAI base URL ending in ``/v1``), its
  model named ``served_model_name`` there (default: the model's name);
- embedded: the launcher (``serving llm``, started by ``serving up``) runs one vLLM server per model
  version and set of launch options, and maps its key (serving/llm/naming.py: ``"<model>:<version>"``,
  ``@<hash>`` added for options) to its URL and state at ``SERVING_LLM_LAUNCHER_URL/engines``.
  The map is asked again at most once a second, and at once after a connection to an engine failed
  (a restarted engine comes back on another port).

The request's ``model`` (what the client named: the endpoint, or ``endpoint/version``) is rewritten
to the engine's served name on the way in, and back in answers and the engine's error messages. An
engine that does not answer is a 503 with ``Retry-After``; what the engine refuses keeps its status and its OpenAI error (:class:`EngineRefused`).
Closing a stream (the client went away) closes the upstream connection, and vLLM aborts the generation.

Pooled connections: vLLM's server closes a keep-alive connection idle for 5 s (uvicorn's
``--timeout-keep-alive``). A request sent on a pooled connection just as the engine closes it fails
before any byte of the answer (``ServerDisconnectedError``): aiohttp retries that by itself for GET, never
for POST. So the pool keeps idle connections for ``KEEPALIVE_S``, shorter than the engine does, and a
POST that fails that way on a reused connection is sent once more on a connection of its own (nothing was
answered, so the engine generated nothing the client will see twice).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable

import aiohttp
import httpx
import orjson

from serving.llm.naming import engine_key
from serving.worker.engines.sse import DONE, SseEvent, read_events
from serving.worker.errors import BadGateway, BadRequest, GatewayTimeout, ServingError, Unavailable, brief
from serving.worker.llm_tokens import PromptCounter
from serving.worker.runtime import Target

MAP_TTL_S = 1.0  # how long the launcher's map is reused
RETRY_AFTER_S = 2
KEEPALIVE_S = 2.0  # idle pooled connections closed after this: well inside vLLM's 5 s, so it rarely closes first


class EngineRefused(ServingError):
    """The engine answered with an error: its status and its OpenAI ``error`` object, passed on."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message") or "the engine refused the request"))
        self.status, self.error = status, error


@dataclass(frozen=True)
class Upstream:
    url: str                # the engine's OpenAI base URL, ending in /v1
    served_model_name: str  # the model's name at the engine


def served_name(target: Target) -> str:
    """The launcher's key of this version's engine (its options decide which engine, not only the version)."""
    return engine_key(target.model, target.version, target.engine_options)


class VllmEngine:
    kind = "llm"            # the data plane's generation path (generation.py), not infer() or run()
    calls_user_load = False  # ClearML's vllm preprocess builds its engine in load(): never here (docs/llm.md)

    def __init__(self, launcher_url: str, timeout_s: float, counter: PromptCounter) -> None:
        self.launcher_url = launcher_url.rstrip("/")
        self.timeout_s = timeout_s
        self.tokens = counter
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # never pooled: the one retry of a stale connection
        self._map: dict[str, Any] = {}
        self._map_at = 0.0

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:  # in the worker's event loop, on first use
            self._session = self._new_session(aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                                              [_reuse_trace()])
        return self._session

    def fresh_session(self) -> aiohttp.ClientSession:
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._new_session(aiohttp.TCPConnector(limit=0, force_close=True), [])
        return self._fresh

    def _new_session(self, connector: aiohttp.TCPConnector, traces: list) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=self.timeout_s),
            connector=connector, headers={"content-type": "application/json"}, trace_configs=traces)

    # --- engine interface -------------------------------------------------------------
    def prepare(self, target: Target) -> None:
        self.tokens.prepare(target)

    def retain(self, targets: Iterable[Target]) -> None:
        self.tokens.retain(targets)

    def is_ready(self, target: Target) -> bool:
        """From the readiness gate's thread: external engines by their /health, embedded ones by the
        launcher's state (``ready`` once the engine's /health answered)."""
        try:
            url = target.engine_options.get("url")
            if url:
                return httpx.get(_health(url), timeout=2.0).status_code == 200
            entry = httpx.get(f"{self.launcher_url}/engines", timeout=2.0).json()["engines"].get(served_name(target))
            return bool(entry) and entry.get("state") == "ready"
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return False

    async def ready(self, target: Target) -> bool:
        return await asyncio.to_thread(self.is_ready, target)

    async def close(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()

    # --- where a version's engine is ----------------------------------------------------
    async def upstream(self, target: Target) -> Upstream:
        options = target.engine_options
        if options.get("url"):
            return Upstream(str(options["url"]).rstrip("/"), str(options.get("served_model_name") or target.model))
        name = served_name(target)
        entry = (await self._engines(fresh=False)).get(name)
        if not entry or entry.get("state") != "ready":  # the cached map may be older than the engine's start
            entry = (await self._engines(fresh=True)).get(name)
        if not entry:
            raise Unavailable(f"no LLM engine runs model {name} yet (the launcher at {self.launcher_url} "
                              "has not started it)", retry_after_s=RETRY_AFTER_S)
        if entry.get("state") != "ready":
            why = f": {entry['error']}" if entry.get("error") else ""
            raise Unavailable(f"the LLM engine of model {name} is {entry.get('state')}{why}",
                              retry_after_s=RETRY_AFTER_S)
        return Upstream(str(entry["url"]).rstrip("/"), str(entry.get("served_model_name") or name))

    async def _engines(self, fresh: bool) -> dict[str, Any]:
        if not fresh and time.monotonic() - self._map_at < MAP_TTL_S:
            return self._map
        try:
            async with self.session().get(f"{self.launcher_url}/engines",
                                          timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                self._map = dict(orjson.loads(await r.read())["engines"])
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise Unavailable(f"the LLM launcher at {self.launcher_url} does not answer ({type(exc).__name__})",
                              retry_after_s=RETRY_AFTER_S) from None
        self._map_at = time.monotonic()
        return self._map

    # --- requests ---------------------------------------------------------------------------
    async def post(self, target: Target, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming call (``route``: ``chat/completions``, ``completions``, ``embeddings``);
        ``body["model"]``: the client's name of the model, put back in the answer."""
        response, up = await self._send(target, route, body)
        raw = await self._read(target, response)
        if response.status != 200:
            raise _refused(response.status, raw, up, target, body["model"])
        return _decode(raw, up, target, body["model"])

    async def stream(self, target: Target, route: str, body: dict[str, Any]) -> "EngineStream":
        """Open a streaming call; an error before the first event is raised here, with its status."""
        response, up = await self._send(target, route, body)
        if response.status != 200:
            raise _refused(response.status, await self._read(target, response), up, target, body["model"])
        return EngineStream(response, up, body["model"], lambda exc: self._failed(target, exc))

    async def _send(self, target: Target, route: str, body: dict[str, Any]) -> tuple[aiohttp.ClientResponse, Upstream]:
        """One call to the engine, up to its status line; a call cancelled on the way (the client left)
        closes its connection, which is how the engine learns to stop."""
        up = await self.upstream(target)
        url, data, sent = f"{up.url}/{route}", _encode(body, up), {"reused": False}
        try:
            try:
                return await self.session().post(url, data=data, trace_request_ctx=sent), up
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError) or not sent["reused"]:
                    raise
            # a pooled connection the engine closed as it was reused: nothing answered, so once more, anew
            return await self.fresh_session().post(url, data=data), up
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._failed(target, exc) from None

    async def _read(self, target: Target, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._failed(target, exc) from None
        finally:
            response.release()

    def _failed(self, target: Target, exc: Exception) -> ServingError:
        """Past the read timeout a 504; an engine that cannot be reached, or broke the connection, a 503."""
        if isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError):
            return GatewayTimeout(f"the LLM engine of {served_name(target)} did not answer within "
                                  f"{self.timeout_s:g} s")
        return self._down(target, exc)

    def _down(self, target: Target, exc: Exception) -> Unavailable:
        self._map_at = 0.0  # ask the launcher again: a restarted engine may be elsewhere
        return Unavailable(f"the LLM engine of model {served_name(target)} is not answering "
                           f"({type(exc).__name__}: {brief(exc) or 'connection failed'})", retry_after_s=RETRY_AFTER_S)


@dataclass
class StreamEvent:
    event: dict[str, Any] | None  # the parsed event, the model renamed; None for the stream's ``[DONE]``
    data: bytes                   # its JSON as the engine wrote it, the model renamed, to pass on as is


class EngineStream:
    """An engine's Server-Sent Events, parsed, the events of one read together (sse.py), with the
    model's name rewritten back in place (the event is not written again); closing it closes the
    upstream connection."""

    def __init__(self, response: aiohttp.ClientResponse, up: Upstream, public: str,
                 failed: Callable[[Exception], ServingError]) -> None:
        self.response, self.up, self.public, self.failed = response, up, public, failed
        self._served_field = b'"model":' + orjson.dumps(up.served_model_name)
        self._public_field = b'"model":' + orjson.dumps(public)

    async def batches(self) -> AsyncIterator[list[StreamEvent]]:
        try:
            async for events in read_events(data async for data, _ in self.response.content.iter_chunks()):
                yield [item for item in map(self._parsed, events) if item is not None]
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self.failed(exc) from None

    def _parsed(self, sse: SseEvent) -> StreamEvent | None:
        if sse.data.strip() == DONE:
            return StreamEvent(None, DONE)
        try:
            event = orjson.loads(sse.data)
        except orjson.JSONDecodeError:
            raise BadGateway(f"the LLM engine of {self.up.served_model_name} sent an event that is not JSON: "
                             f"{brief(sse.data.decode(errors='replace'))}") from None
        if not isinstance(event, dict):
            return None
        data = sse.data
        if event.get("model") == self.up.served_model_name:
            event["model"] = self.public
            # the field as vLLM writes it (no spaces): a key, never inside a string, where quotes are escaped
            data = (data.replace(self._served_field, self._public_field, 1) if self._served_field in data
                    else orjson.dumps(event))
        return StreamEvent(event, data)

    async def aclose(self) -> None:
        """A stream read to its end keeps its connection for the next call; one cut short closes it,
        and the engine aborts the generation."""
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


def _reuse_trace() -> aiohttp.TraceConfig:
    """Marks a request's ``trace_request_ctx`` (a dict) when it went out on a pooled connection."""
    async def reused(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    return trace


def _health(base_url: str) -> str:
    root = base_url.rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root) + "/health"


def _encode(body: dict[str, Any], up: Upstream) -> bytes:
    return orjson.dumps({**body, "model": up.served_model_name})


def _decode(raw: bytes, up: Upstream, target: Target, public: str) -> dict[str, Any]:
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadGateway(f"the LLM engine of {served_name(target)} answered something that is not JSON") from None
    if isinstance(answer, dict) and answer.get("model") == up.served_model_name:
        answer["model"] = public
    return answer


def _refused(status: int, raw: bytes, up: Upstream, target: Target, public: str) -> ServingError:
    try:
        error = orjson.loads(raw).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if not isinstance(error, dict):
        if status == 404:  # the route itself: vLLM serves embeddings for embedding (pooling) models only
            return BadRequest(f"model {public} does not serve this route: its engine runs a model of another "
                              "kind (embeddings need an embedding model)")
        error = {"message": brief(raw.decode(errors="replace")) or f"HTTP {status}"}
    if status >= 500:
        return BadGateway(f"the LLM engine of {served_name(target)} failed: {error.get('message')}")
    error["message"] = str(error.get("message", "")).replace(up.served_model_name, public)
    return EngineRefused(status, error)


def create(settings: Any, artifact_path: Callable[[str], Path]) -> VllmEngine:
    counter = PromptCounter(artifact_path, settings.home / "cache" / "llm-tokenizers")
    return VllmEngine(settings.llm_launcher_url, settings.llm_timeout_s, counter)
