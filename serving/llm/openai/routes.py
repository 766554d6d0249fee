"""The OpenAI routes the worker serves, each declared once: its request schema, what the model reads
(for the context check, usage counting and prefix routing), whether a shadow compares its answers, and
whether preprocess.py's ``send_request`` may call it.

Why one table: a route's facts used to be written in five modules (the relay's route list and two
branches on its name, the schemas, the prompt counting, the shadows' list, ``send_request``'s list),
so adding one meant finding them all. Now adding a route is a line here and its handler in
serving/llm/openai/frontend.py; everything else reads these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from serving.llm.openai.protocol import ChatRequest, CompletionRequest, EmbeddingRequest, validated


@dataclass(frozen=True)
class OpenAIRoute:
    path: str                    # under /v1
    schema: type[BaseModel]      # the request, checked at the edge (protocol.py)
    prompt: str | None           # the field the model reads: its tokens count against the context and in
    #                              ``usage``; None: no generation (no context check, nothing to count)
    shadow_compared: bool        # a shadow's answer is compared with the live one (llm/shadow_compare.py)
    sendable: bool               # preprocess.py's send_request may call it (serving/worker/pipeline.py)

    @property
    def chat(self) -> bool:
        """Messages, rendered with the model's chat template before they are tokens."""
        return self.prompt == "messages"


ROUTES: dict[str, OpenAIRoute] = {r.path: r for r in (
    OpenAIRoute("chat/completions", ChatRequest, "messages", shadow_compared=True, sendable=True),
    OpenAIRoute("completions", CompletionRequest, "prompt", shadow_compared=True, sendable=True),
    OpenAIRoute("embeddings", EmbeddingRequest, None, shadow_compared=False, sendable=False),
)}


def compared() -> tuple[str, ...]:
    return tuple(path for path, r in ROUTES.items() if r.shadow_compared)


def sendable() -> tuple[str, ...]:
    return tuple(path for path, r in ROUTES.items() if r.sendable)


def checked(route: str, doc: Any) -> dict[str, Any]:
    """The request as sent, once it has the shape ``route`` needs; an InvalidRequest naming the field if not."""
    return validated(ROUTES[route].schema, doc)
