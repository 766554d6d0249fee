"""The data plane's path for generation: an OpenAI request to an LLM endpoint, protocol-agnostic.

Composed with :class:`DataPlane` (its endpoints, routing, client keys and statistics), so an LLM
endpoint is routed, keyed and counted as any other: ``model`` names the endpoint (``endpoint`` or
``endpoint/version``), canary weights and a sticky routing key pick the version, one statistics
event a request carries the token usage and the latency. The OpenAI front end
(serving/llm/openai/frontend.py) and ``send_request`` (pipeline.py) call :meth:`Generation.run`.

A user's ``preprocess.py`` (ClearML's interface) sees ``{"request": <the OpenAI request>}`` and may
change the request; its ``postprocess`` gets the engine's answer of a non-streaming request. Its
``load`` is not called for such endpoints (the engine runs elsewhere: docs/llm.md). A prompt past
the model's context is a 400 here, counted with the model's own tokenizer, before the engine sees it.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import orjson

from preprocess.base import PreprocessError
from serving.tracing import spans
from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, ServingError
from serving.worker.lifecycle import CLIENT_CLOSED, RequestLife, RequestStats
from serving.llm.engines.api import GenerationStream, LLMEngine
from serving.llm.relay.hints import route_hint
from serving.llm.openai.routes import ROUTES
from serving.llm.openai.protocol import InvalidRequest
from serving.llm.relay.shadow_compare import LlmShadow, StreamText, choice_texts, completions
from serving.llm.relay.timing import GenerationTimer
from serving.worker.runtime import EndpointRuntime, Target

# a prompt up to this size (as JSON) is counted on the event loop: its tokens take ~20 µs to count here,
# a hop to a thread ~90 µs, and 32 streams starting at once queued those hops into their TTFT
INLINE_COUNT_BYTES = 2_000


@dataclass
class Generated:
    target: Target
    body: dict[str, Any] | None = None            # a non-streaming answer
    events: AsyncIterator[bytes] | None = None    # a stream: Server-Sent Events, as they come


def split_model(model: str) -> tuple[str, int | None]:
    """``endpoint`` or ``endpoint/version``."""
    name, _, version = model.strip("/").partition("/")
    if not version:
        return name, None
    if not (version.isascii() and version.isdigit()) or int(version) < 1:
        raise NotFound(f"model {model!r}: the part after '/' must be a version number (endpoint/version)")
    return name, int(version)


class Generation:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.shadow = LlmShadow(dataplane.shadow, dataplane.engines)  # copies to a shadow version (shadow_compare.py)

    def is_llm(self, ep: EndpointRuntime) -> bool:
        return getattr(self.dataplane.engines.get(ep.engine), "kind", None) == "llm"

    def endpoints(self, allowed: frozenset[str] | None = None) -> list[EndpointRuntime]:
        """The LLM endpoints this worker serves (those a key may call, when ``allowed`` is given)."""
        return [ep for name, ep in sorted(self.dataplane.config.current.endpoints.items())
                if self.is_llm(ep) and (allowed is None or name in allowed)]

    def llm_endpoint(self, name: str) -> EndpointRuntime:
        ep = self.dataplane.endpoint(name)
        if not self.is_llm(ep):
            known = ", ".join(e.name for e in self.endpoints()) or "none"
            raise NotFound(f"endpoint {name!r} is not an LLM endpoint (its engine is {ep.engine}; "
                           f"LLM endpoints: {known}); call it on /serve/{name}")
        return ep

    async def run(self, route: str, request: dict[str, Any], routing_key: str | None = None,
                  client: str | None = None, session: str | None = None) -> Generated:
        """``request``: a validated OpenAI request; ``client``: the key's name (the caller checked it);
        ``session``: the ``X-Session-Id`` header (the ``session`` routing policy's key)."""
        name, version = split_model(request["model"])
        ep = self.llm_endpoint(name)
        target = self.dataplane.route(ep, version, routing_key)
        engine: LLMEngine = self.dataplane.engines[ep.engine]
        with self.dataplane.life(ep.name, target.version, client) as life:
            stats = life.stats
            if stats.captured is not None:  # the prediction log keeps it: the request as the client sent it
                stats.captured.inputs = request
            processor = ep.processor_for(target) if ep.preprocess_kind == "user" else None
            with spans.span("preprocess"):
                request = await _preprocess(processor, request, life.state, stats)
            stats.stage("preprocess")
            await _check_context(engine, target, route, request)
            copies = self.shadow.pick(ep, route, request) if version is None else None
            hint = route_hint(engine.tokens, target, route, request, session)
            if request.get("stream"):
                wants_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                upstream = {**request, "stream_options": {**(request.get("stream_options") or {}),
                                                          "include_usage": True}}
                engine_span = spans.start("engine", **{"serving.engine": ep.engine, "serving.version": target.version})
                try:
                    with spans.within(engine_span):  # the stream's request carries this span's context
                        stream = await engine.stream(target, route, upstream, hint)
                except BaseException as exc:
                    spans.end(engine_span, getattr(exc, "status", 500))
                    raise
                life.hand_off()
                timer = GenerationTimer(stats.t0, stream=True)
                compare = None if copies is None else (lambda texts: self.shadow.fire(copies, target, route, texts))
                return Generated(target, events=self._relay(stream, life, wants_usage, timer, compare, engine_span))
            with spans.span("engine", **{"serving.engine": ep.engine, "serving.version": target.version}):
                answer = await engine.post(target, route, request, hint)
            stats.stage("inference")
            await _fill_usage(engine, target, route, request, answer)
            stats.extra["usage"] = _usage(answer.get("usage"))
            timer = GenerationTimer(stats.t0, stream=False)
            timer.answered(answer)
            stats.extra["llm"] = timer.event(stats.extra["usage"])
            texts = choice_texts(answer)  # the engine's own text, compared with the shadow engine's
            if stats.captured is not None:
                stats.captured.outputs, stats.captured.usage = completions(texts), stats.extra["usage"]
            _charge(life)
            if processor is not None:
                with spans.span("postprocess"):
                    answer = await processor.postprocess(answer, life.state, stats.collect)
            stats.stage("postprocess")
            self.shadow.fire(copies, target, route, texts)
            return Generated(target, body=answer)

    async def _relay(self, stream: GenerationStream, life: RequestLife, wants_usage: bool,
                     timer: GenerationTimer, ended: Callable[[dict[int, str]], None] | None,
                     engine_span: Any = None) -> AsyncIterator[bytes]:
        """Each read of the engine on as it comes, in one write. The engine is always asked for usage (the
        statistics need it); a client that did not ask gets no usage chunk. A read of tokens only goes on
        as its bytes (api.py's StreamBatch); the events of any other are looked at one by one. A stream
        the engine breaks ends with an OpenAI error event (the status line is long gone). ``ended``: the
        shadow copy to start with the stream's text once it has ended well (None: no copy, no text kept)."""
        status, usage, stats = CLIENT_CLOSED, None, life.stats
        text = StreamText() if ended is not None or stats.captured is not None else None
        try:
            async for batch in stream.batches():
                if "ttft_s" not in stats.extra:
                    stats.extra["ttft_s"] = time.perf_counter() - stats.t0
                if batch.data is not None and text is None:
                    timer.tokens(batch.content)
                    yield batch.data
                    continue
                out: list[bytes] = []
                for item in batch.events():
                    event = item.event
                    if event is None:  # the end: a client may hang up as soon as it reads it
                        status = 200
                        out.append(b"data: [DONE]\n\n")
                        continue
                    if event.get("usage"):
                        usage = event["usage"]
                    timer.chunk(event)
                    if text is not None:
                        text.add(event)
                    data = item.data
                    if not wants_usage and "usage" in event:
                        if event["usage"] and not event.get("choices"):
                            continue
                        event.pop("usage")
                        data = orjson.dumps(event)
                    out.append(b"data: " + data + b"\n\n")
                if out:
                    yield b"".join(out)
            status = 200
        except ServingError as exc:
            status, stats.error = exc.status, exc.message
            error = {"error": {"message": exc.message, "type": "service_unavailable", "param": None,
                               "code": exc.status}}
            yield b"data: " + orjson.dumps(error) + b"\n\n"
        finally:
            await stream.aclose()
            spans.end(engine_span, status)  # the engine's span lasts as long as its stream
            stats.stage("inference")
            stats.extra["usage"] = _usage(usage)
            stats.extra["llm"] = timer.event(stats.extra["usage"])
            _charge(life)
            if stats.captured is not None and text is not None:
                stats.captured.outputs, stats.captured.usage = completions(text.texts()), stats.extra["usage"]
            life.end(status)
            if status == 200 and ended is not None and text is not None:  # a shadow copy starts once the live
                ended(text.texts())                                       # stream has ended (never before)

def _charge(life: RequestLife) -> None:
    """The request's tokens against its key's tokens per minute (client_keys.py), once they are known."""
    usage = life.stats.extra.get("usage")
    if usage:
        life.charge_tokens(usage["prompt_tokens"] + usage["completion_tokens"])


async def _preprocess(processor: Any, request: dict[str, Any], state: dict, stats: RequestStats) -> dict[str, Any]:
    """ClearML's vllm preprocess gets ``{"request": ...}`` and returns that body, changed or not."""
    if processor is None:
        return request
    out = await processor.preprocess({"request": request}, state, stats.collect)
    changed = out.get("request") if isinstance(out, dict) else None
    if not isinstance(changed, dict):
        raise PreprocessError("preprocess() in preprocess.py must return the body it got, the OpenAI request "
                              "under 'request'")
    return {**changed, "model": request["model"]}


def _count(engine: LLMEngine, target: Target, field: str, request: dict[str, Any]) -> list[int | None] | None:
    if field == "messages":
        return [engine.tokens.chat(target, request)]
    return engine.tokens.prompts(target, request["prompt"])


async def _check_context(engine: LLMEngine, target: Target, route: str, request: dict[str, Any]) -> None:
    """Prompt tokens + max_tokens must fit the model's context (at least one token when max_tokens is unset)."""
    limit = int(target.engine_options.get("max_model_len") or target.llm.get("max_model_len") or 0)
    field = ROUTES[route].prompt
    if not limit or field is None:
        return
    try:
        if engine.tokens.loaded(target) and len(orjson.dumps(request[field])) <= INLINE_COUNT_BYTES:
            counts = _count(engine, target, field, request)
        else:  # a long text (or a tokenizer still to read): the event loop goes on meanwhile
            counts = await asyncio.to_thread(_count, engine, target, field, request)
    except Exception as exc:  # a chat template that refuses these messages: vLLM would refuse them too
        raise InvalidRequest(f"the {field} cannot be rendered with the model's tokenizer: "
                             f"{type(exc).__name__}: {exc}", param=field) from None
    if not counts or counts[0] is None:
        return
    asked = request.get("max_completion_tokens") or request.get("max_tokens")
    for count in counts:
        if count + (asked or 1) > limit:
            param = "max_tokens" if asked and count < limit else field
            raise InvalidRequest(
                f"this model's context is {limit} tokens; the {field} has {count} tokens"
                + (f" and max_tokens asks for {asked} more" if asked else ", leaving no room for an answer"),
                param=param, code="context_length_exceeded")


async def _fill_usage(engine: LLMEngine, target: Target, route: str, request: dict[str, Any],
                      answer: dict[str, Any]) -> None:
    """``usage`` is always in a non-streaming answer: an engine that leaves it out gets it counted here."""
    if not isinstance(answer, dict) or answer.get("usage") or ROUTES[route].prompt is None:
        return
    if ROUTES[route].chat:
        prompt = await asyncio.to_thread(engine.tokens.chat, target, request)
        texts = [(c.get("message") or {}).get("content") or "" for c in answer.get("choices") or ()]
    else:
        prompt = sum(await asyncio.to_thread(engine.tokens.prompts, target, request["prompt"]) or [0])
        texts = [c.get("text") or "" for c in answer.get("choices") or ()]
    completion = sum([await asyncio.to_thread(engine.tokens.text, target, t) or 0 for t in texts])
    if prompt is not None:
        answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}


def _usage(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, dict):
        return None
    return {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0)}
