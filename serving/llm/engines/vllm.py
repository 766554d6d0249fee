"""Engine ``vllm``: generation runs in vLLM's own OpenAI server, a process apart; the worker is its client.

The worker keeps what it does for every endpoint (routing, keys, preprocess, statistics:
serving/llm/relay/generation.py) and forwards the OpenAI request over HTTP (aiohttp, one pooled session
per worker process: its C parser costs a streamed token about half the CPU httpx's stack did,
measured in docs/benchmarks.md). Where a version's engines are (each may have several replicas,
serving/llm/routing/replicas.py):

- external: the endpoint's ``engine_options["url"]`` (an OpenAI base URL ending in ``/v1``, or
  several, comma-separated; names resolved to every address, serving/llm/routing/external.py), its
  model named ``served_model_name`` there (default: the model's name);
- embedded: the launcher (``serving llm``, started by ``serving up``) runs ``replicas`` vLLM servers per
  model version and set of launch options, and maps their key (serving/llm/naming.py:
  ``"<model>:<version>"``, ``@<hash>`` added for options) to each replica's URL and state at
  ``SERVING_LLM_LAUNCHER_URL/engines``. The map is asked again at most once a second, and at once after
  a connection to an engine failed (a restarted engine may come back elsewhere). A request for an engine
  scaled to zero is held while the launcher wakes it (serving/llm/engines/wake.py).

Which replica gets a request is the endpoint's routing policy's choice (``routing`` option,
serving/llm/routing/policies/); should its connection fail before any byte of the answer, the next replica
in the policy's order gets it, and the failed one is taken out until its ``/health`` answers.

The request's ``model`` (what the client named: the endpoint, or ``endpoint/version``) is rewritten
to the engine's served name on the way in, and back in answers and the engine's error messages. An
engine that does not answer is a 503 with ``Retry-After``; what the engine refuses keeps its status and its
OpenAI error (:class:`EngineRefused`).
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
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import aiohttp
import httpx
import orjson

from serving.tracing import spans
from serving.llm.naming import adapter_name, target_engine
from serving.worker.errors import BadGateway, BadRequest, GatewayTimeout, ServingError, Unavailable, brief
from serving.llm.engines.openai_stream import EngineStream, Upstream
from serving.llm.engines.wake import HoldLimits, Holds, asleep
from serving.llm.routing.external import ExternalReplicas
from serving.llm.routing.replicas import Member, ReplicaSet
from serving.llm.routing.policies.base import Replica, RouteHint
from serving.llm.relay.tokens import PromptCounter
from serving.worker.runtime import Target

log = logging.getLogger(__name__)

MAP_TTL_S = 1.0  # how long the launcher's map is reused
MAP_STALE_S = 30.0  # how long it still routes while the launcher does not answer
MAP_READ_TIMEOUT_S = 5.0
RETRY_AFTER_S = 2
KEEPALIVE_S = 2.0  # idle pooled connections closed after this: well inside vLLM's 5 s, so it rarely closes first


class EngineRefused(ServingError):
    """The engine answered with an error: its status and its OpenAI ``error`` object, passed on."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message") or "the engine refused the request"))
        self.status, self.error = status, error


def served_name(target: Target) -> str:
    """The launcher's key of this version's engine (its options decide which engine, not only the version;
    a LoRA adapter's is its base's)."""
    return target_engine(target.model, target.version, {"lora": target.lora}, target.engine_options)


def adapter_of(target: Target) -> str | None:
    """A LoRA adapter version's name in its base's engines; None for any other version."""
    return adapter_name(target.model, target.version) if target.lora.get("base") else None


class VllmEngine:
    """vLLM's OpenAI server as an LLM engine (serving/llm/engines/api.py: LLMEngine)."""

    kind = "llm"            # the data plane's generation path (llm/relay.py), not infer() or run()
    calls_user_load = False  # ClearML's vllm preprocess builds its engine in load(): never here (docs/llm.md)

    def __init__(self, launcher_url: str, timeout_s: float, counter: PromptCounter,
                 hold: HoldLimits | None = None) -> None:
        self.launcher_url = launcher_url.rstrip("/")
        self.timeout_s = timeout_s
        self.tokens = counter
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # never pooled: the one retry of a stale connection
        self._map: dict[str, Any] = {}
        self._map_at = 0.0   # when the map was read; set to 0 to have it read again
        self._read_at = 0.0  # when the launcher last answered
        self._map_lock = asyncio.Lock()
        self._sets: dict[str, ReplicaSet] = {}               # per engine key, or external url setting
        self._external: dict[str, ExternalReplicas] = {}
        self.holds = Holds(self.launcher_url, self.session, lambda: self._engines(fresh=True), hold or HoldLimits())

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
        launcher's state (``ready`` once the engine's /health answered). One scaled to zero (or being woken
        from it) counts as ready: routed, its requests wake it; left out of the split, nothing would."""
        url = target.engine_options.get("url")
        if url:
            return any(_answers(_health(one)) for one in str(url).split(","))
        try:
            entry = httpx.get(f"{self.launcher_url}/engines", timeout=2.0).json()["engines"].get(served_name(target))
            adapter = adapter_of(target)
            if asleep(entry):
                return True
            if adapter is not None:  # loaded on a ready replica
                return any(m.ready and adapter in m.adapters for m in _members(entry))
            return bool(entry) and entry.get("state") == "ready"
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return False

    async def ready(self, target: Target) -> bool:
        return await asyncio.to_thread(self.is_ready, target)

    async def close(self) -> None:
        await self.holds.close()
        for replicas in self._sets.values():
            await replicas.close()
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()

    # --- where a version's engines are -----------------------------------------------------
    async def route(self, target: Target, hint: RouteHint | None = None) -> Route:
        """The replicas to try for this request, in its endpoint's policy's order (at least one)."""
        if target.engine_options.get("url"):
            replicas, served, adapter = await self._external_replicas(target)
        else:
            replicas, served, adapter = await self._embedded_replicas(target)
        order = replicas.order(target.engine_options.get("routing"), hint or RouteHint(), adapter)
        if not order:
            what = f"adapter {adapter} is loaded on no ready replica" if adapter else "no replica is ready"
            raise Unavailable(f"the LLM engine of model {served_name(target)}: {what} yet", retry_after_s=RETRY_AFTER_S)
        return Route(replicas, order, served)

    async def _external_replicas(self, target: Target) -> tuple[ReplicaSet, str, None]:
        setting = str(target.engine_options["url"])
        source = self._external.get(setting) or self._external.setdefault(setting, ExternalReplicas(setting))
        replicas = self._set(setting)
        replicas.update(await source.members())
        return replicas, str(target.engine_options.get("served_model_name") or target.model), None

    async def _embedded_replicas(self, target: Target) -> tuple[ReplicaSet, str, str | None]:
        """The launcher's replicas of the version's engine (its base's, for a LoRA adapter: then the
        request names the adapter there, and only replicas holding it take it)."""
        key, adapter = served_name(target), adapter_of(target)
        replicas = self._set(key)
        entry = (await self._engines(fresh=False)).get(key)
        if not _serving(entry, adapter):  # the cached map may be older than the engine's start
            entry = (await self._engines(fresh=True)).get(key)
        if asleep(entry):  # scaled to zero: held until it is ready again
            entry = await self.holds.wait(key, entry)  # type: ignore[arg-type]
        self._check(key, entry)
        replicas.update(_members(entry))
        return replicas, adapter or key, adapter

    def _set(self, name: str) -> ReplicaSet:
        if name not in self._sets:
            self._sets[name] = ReplicaSet(name, self.session)
        return self._sets[name]

    def _check(self, name: str, entry: dict[str, Any] | None) -> None:
        if not entry:
            raise Unavailable(f"no LLM engine runs model {name} yet (the launcher at {self.launcher_url} "
                              "has not started it)", retry_after_s=RETRY_AFTER_S)
        if entry.get("state") != "ready":
            why = f": {entry['error']}" if entry.get("error") else ""
            raise Unavailable(f"the LLM engine of model {name} is {entry.get('state')}{why}",
                              retry_after_s=RETRY_AFTER_S)

    async def _engines(self, fresh: bool) -> dict[str, Any]:
        """The launcher's map: reused for ``MAP_TTL_S`` unless ``fresh``; one read at a time, which a burst
        of requests shares (8 streams at once each read it, and a launcher busy checking its engines
        answered none within ``MAP_READ_TIMEOUT_S``: all 503). A launcher that does not answer leaves the last map in use
        for ``MAP_STALE_S``: which replica is up the replicas' own probes tell (llm/replicas.py)."""
        asked = time.monotonic()
        if not fresh and asked - self._map_at < MAP_TTL_S:
            return self._map
        async with self._map_lock:
            if self._map_at >= asked or (not fresh and time.monotonic() - self._map_at < MAP_TTL_S):
                return self._map  # read by another request meanwhile
            try:
                async with self.session().get(f"{self.launcher_url}/engines",
                                              timeout=aiohttp.ClientTimeout(total=MAP_READ_TIMEOUT_S)) as r:
                    self._map = dict(orjson.loads(await r.read())["engines"])
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
                if self._map and time.monotonic() - self._read_at < MAP_STALE_S:
                    log.warning("the LLM launcher at %s does not answer (%s): its map of %.0f s ago is used",
                                self.launcher_url, type(exc).__name__, time.monotonic() - self._read_at)
                    return self._map
                raise Unavailable(f"the LLM launcher at {self.launcher_url} does not answer ({type(exc).__name__})",
                                  retry_after_s=RETRY_AFTER_S) from None
            self._map_at = self._read_at = time.monotonic()
            return self._map

    # --- requests ---------------------------------------------------------------------------
    async def post(self, target: Target, route: str, body: dict[str, Any],
                   hint: RouteHint | None = None) -> dict[str, Any]:
        """A non-streaming call (``route``: ``chat/completions``, ``completions``, ``embeddings``);
        ``body["model"]``: the client's name of the model, put back in the answer."""
        response, up, done = await self._send(target, route, body, hint)
        try:
            raw = await self._read(target, response)
        finally:
            done()
        if response.status != 200:
            raise _refused(response.status, raw, up, target, body["model"])
        return _decode(raw, up, target, body["model"])

    async def stream(self, target: Target, route: str, body: dict[str, Any],
                     hint: RouteHint | None = None) -> "EngineStream":
        """Open a streaming call; an error before the first event is raised here, with its status."""
        response, up, done = await self._send(target, route, body, hint)
        if response.status != 200:
            try:
                raw = await self._read(target, response)
            finally:
                done()
            raise _refused(response.status, raw, up, target, body["model"])
        return EngineStream(response, up, body["model"], lambda exc: self._failed(target, exc), done)

    async def _send(self, target: Target, route: str, body: dict[str, Any],
                    hint: RouteHint | None) -> tuple[aiohttp.ClientResponse, Upstream, Callable[[], None]]:
        """One call, up to its status line, on the first replica of the route that answers. A replica
        whose connection fails before any byte of the answer is taken out and the next one tried (nothing
        was answered, so the engine generated nothing the client will see twice); a call that timed out
        waiting for its answer is not sent again (the engine may be generating it). A call cancelled on
        the way (the client left) closes its connection, which is how the engine learns to stop."""
        path = await self.route(target, hint)
        data, last = _encode(body, path.served), None
        for replica in path.order:
            replica.in_flight += 1
            try:
                response = await self._post(f"{replica.url}/{route}", data)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                replica.in_flight -= 1
                if not _before_answer(exc):
                    raise self._failed(target, exc) from None
                path.replicas.take_out(replica, exc)
                self._map_at = 0.0  # ask the launcher again: a restarted engine may be elsewhere
                last = exc
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            if replica is not path.order[0]:
                path.replicas.failovers += 1
            return response, Upstream(replica.url, path.served), _once(replica)
        raise self._failed(target, last or ConnectionError("no replica")) from None

    async def _post(self, url: str, data: bytes) -> aiohttp.ClientResponse:
        """On a pooled connection; one the engine closed just as it was reused is sent once more anew."""
        sent = {"reused": False}
        trace = spans.headers()  # the engine span's context: vLLM's own spans join the trace (docs/tracing.md)
        try:
            return await self.session().post(url, data=data, trace_request_ctx=sent, headers=trace or None)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) or not sent["reused"]:
                raise
        return await self.fresh_session().post(url, data=data, headers=trace or None)

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
class Route:
    replicas: ReplicaSet
    order: list[Replica]    # the replicas to try, first choice first
    served: str             # the model's name at these engines


def _once(replica: Replica) -> Callable[[], None]:
    """The end of a request on ``replica``, counted once however often it is called."""
    state = {"open": True}

    def done() -> None:
        if state["open"]:
            state["open"] = False
            replica.in_flight -= 1
            replica.answered += 1
    return done


def _before_answer(exc: BaseException) -> bool:
    """The connection failed before any byte of an answer: refused, reset, closed, or not made in time.
    A read that timed out waiting for the answer is not one (the engine may be generating it)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return True
    if isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return False
    return isinstance(exc, aiohttp.ClientConnectionError)


def _serving(entry: dict[str, Any] | None, adapter: str | None = None) -> bool:
    if not entry or entry.get("state") != "ready":
        return False
    return adapter is None or any(m.ready and adapter in m.adapters for m in _members(entry))


def _members(entry: dict[str, Any] | None) -> list[Member]:
    """The launcher's replicas of an engine (one, at its ``url``, from a launcher that lists none)."""
    if not entry:
        return []
    listed = entry.get("replicas") or [{"id": "0", "url": entry["url"], "state": entry.get("state")}]
    return [Member(str(r["id"]), str(r["url"]).rstrip("/"), r.get("state") == "ready",
                   frozenset(r.get("adapters") or ())) for r in listed]


def _reuse_trace() -> aiohttp.TraceConfig:
    """Marks a request's ``trace_request_ctx`` (a dict) when it went out on a pooled connection."""
    async def reused(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    return trace


def _answers(health_url: str) -> bool:
    try:
        return httpx.get(health_url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _health(base_url: str) -> str:
    root = base_url.rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root) + "/health"


def _encode(body: dict[str, Any], served: str) -> bytes:
    return orjson.dumps({**body, "model": served})


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
    return VllmEngine(settings.llm_launcher_url, settings.llm_timeout_s, counter,
                      HoldLimits(settings.llm_hold_max, settings.llm_hold_s))
