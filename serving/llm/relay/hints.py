"""What a request tells the routing policies (serving/llm/routing/policies/): its session, and its prompt's
leading token blocks, the latter computed only when the endpoint's policy asks for them."""
from __future__ import annotations

import logging
from typing import Any

from serving.llm.openai.routes import ROUTES
from serving.llm.routing.policies.base import RouteHint
from serving.llm.routing.policies.prefix import BLOCK_TOKENS, PREFIX_BLOCKS, prefix_key
from serving.llm.relay.tokens import PromptCounter
from serving.worker.runtime import Target

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


def route_hint(tokens: PromptCounter, target: Target, route: str, request: dict[str, Any],
               session: str | None = None) -> RouteHint:
    """``session``: the ``X-Session-Id`` header; OpenAI's ``user`` field when there is none."""
    user = request.get("user")
    return RouteHint(session=session or (user if isinstance(user, str) and user else None),
                     prefix=lambda: _prefix(tokens, target, route, request))


def _prefix(tokens: PromptCounter, target: Target, route: str, request: dict[str, Any]) -> bytes | None:
    if ROUTES[route].prompt is None or not tokens.loaded(target):  # nothing generated; never a file read on the loop
        return None
    try:
        ids = tokens.leading(target, route, request, BLOCK_TOKENS * PREFIX_BLOCKS)
    except Exception as exc:  # a template that refuses these messages: the engine will say so
        log.debug("no prefix key for %s: %s", target.model, exc)
        return None
    return prefix_key(ids) if ids else None
