"""The interface an LLM engine offers the generation path (serving/llm/relay/generation.py): what each call must do.

Why written down: the relay keeps everything an endpoint does whatever runs the model (routing between
versions, keys and limits, preprocessing, statistics, shadows); an engine only gets a validated OpenAI
request to a version's engine and gives back its answer or its events. vLLM's client
(serving/llm/engines/vllm.py) implements it; another engine is a module implementing it and an entry
in serving/llm/naming.py's ``LLM_ENGINE_FACTORIES``. tests/serving/llm/engines/test_api.py checks that vLLM's
client has every member, with the same parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Protocol

from serving.llm.routing.policies.base import RouteHint
from serving.llm.relay.tokens import PromptCounter
from serving.worker.runtime import Target


@dataclass
class StreamEvent:
    """One Server-Sent Event of a generation, ready to pass on."""

    event: dict[str, Any] | None  # the parsed event, the model renamed; None for the stream's ``[DONE]``
    data: bytes                   # its JSON as the engine wrote it, the model renamed, to pass on as is


@dataclass
class StreamBatch:
    """The events of one read from the engine, which the relay writes to its client at once.

    Why two kinds: at a GPU's rate (tens of thousands of tokens a second) parsing every event is most of
    what relaying costs. A *plain* batch holds only token events of the engine's usual shape, the model
    already renamed: ``data`` is what the client gets, byte for byte, and ``content`` how many of its
    events carry a token (timing needs no more). Any other batch (the end, the usage chunk, a finish
    reason, an event of another shape) has ``data`` None, and the relay reads its :meth:`events`.
    """

    data: bytes | None
    content: int
    parse: Callable[[], list[StreamEvent]] = field(repr=False)

    def events(self) -> list[StreamEvent]:
        """Its events, parsed (on demand for a plain batch: a shadow comparison reads their text)."""
        return self.parse()


class GenerationStream(Protocol):
    def batches(self) -> AsyncIterator[StreamBatch]:
        """The engine's events in its order, those that arrived together in one batch. A break after the
        first event raises a ServingError (503 when the engine is gone, 504 past the read timeout): the
        relay turns it into an OpenAI error event."""
        ...

    async def aclose(self) -> None:
        """Close the upstream call (the engine then stops generating) and count the request as ended on
        its replica. Called once the stream ends, however it ends; may be called again."""
        ...


class LLMEngine(Protocol):
    kind: str               # "llm": the data plane hands these requests to the generation path
    tokens: PromptCounter   # prompt lengths with the model's own tokenizer (context checks, routing hints)

    async def post(self, target: Target, route: str, body: dict[str, Any],
                   hint: RouteHint | None = None) -> dict[str, Any]:
        """A non-streaming call. ``route``: the OpenAI path under /v1 (``completions``, ...); ``body``: the
        checked request, its ``model`` the client's name, which the answer must carry back. Raises
        ServingError: the engine's own refusal with its status and OpenAI error, 503 (with Retry-After)
        when no engine of the version answers, 504 past the read timeout."""
        ...

    async def stream(self, target: Target, route: str, body: dict[str, Any],
                     hint: RouteHint | None = None) -> GenerationStream:
        """Open a streaming call; an error before the first event is raised here, as :meth:`post` raises."""
        ...

    def prepare(self, target: Target) -> None:
        """A version is deployed: fetch what its calls will need (its tokenizer), off the request path."""
        ...

    def retain(self, targets: Iterable[Target]) -> None:
        """Only these versions are deployed now: drop what the others held."""
        ...

    def is_ready(self, target: Target) -> bool:
        """From the readiness gate's thread: can the version answer now (its engine up, an adapter loaded)."""
        ...

    async def close(self) -> None:
        """The worker process stops: close connections."""
        ...
