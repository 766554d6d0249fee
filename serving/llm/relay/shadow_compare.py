"""Shadow copies of generation requests: the candidate answers a copy, the answers are compared.

A generation request to an endpoint with a shadow target (``serving model add ... --shadow 100%``)
is copied to the shadow version once the live answer has ended: after a plain answer is ready, or
after a stream's last event was relayed (its text accumulated as it went). The copy runs in the
background through :class:`ShadowMirror` (the same in-flight bound as encoders' copies: past it a
copy is dropped and counted), is always a plain (non-streaming) request, and is streamed to no one.
The client's answer never waits for it.

Agreement, one figure per copy in ``serving_llm_shadow_agreement`` (docs/llm-rollouts.md):

- a *greedy* request (``temperature`` given as 0, or ``top_k`` given as 1) has one right answer per
  model: agreement is 1.0 when every choice's text equals the live one, else 0.0;
- any other request samples, so equal texts are not expected even from the same model: agreement is
  the F1 of the two texts' whitespace-token multisets (bags), averaged over choices. Words rather than
  token ids, because two versions may have different tokenizers; a bag rather than a sequence,
  because sampled answers that say the same things in another order should score high.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from serving.worker.errors import ServingError
from serving.llm.openai.routes import compared
from serving.worker.runtime import EndpointRuntime, Target
from serving.worker.shadow import Copies, ShadowMirror

log = logging.getLogger(__name__)

COMPARED_ROUTES = compared()  # the routes whose answers a shadow compares (serving/llm/openai/routes.py)


def is_greedy(request: dict[str, Any]) -> bool:
    """Greedy decoding: temperature given as 0, or top_k given as 1 (an absent temperature samples)."""
    temperature, top_k = request.get("temperature"), request.get("top_k")
    return (isinstance(temperature, (int, float)) and temperature == 0) or top_k == 1


def choice_texts(answer: Any) -> dict[int, str]:
    """The text of each choice of a plain chat or completions answer, by its index."""
    out: dict[int, str] = {}
    for i, choice in enumerate((answer or {}).get("choices") or () if isinstance(answer, dict) else ()):
        if isinstance(choice, dict):
            text = choice.get("text")
            if text is None:
                text = (choice.get("message") or {}).get("content")
            out[int(choice.get("index", i))] = text or ""
    return out


def completions(texts: dict[int, str]) -> dict[str, Any]:
    """An answer as the prediction log keeps it, the same for chat and completions, plain or streamed:
    each choice's text by its index."""
    return {"choices": [{"index": i, "text": texts[i]} for i in sorted(texts)]}


class StreamText:
    """A stream's text accumulated per choice as its events are relayed."""

    def __init__(self) -> None:
        self.parts: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                self.parts.setdefault(int(choice.get("index", 0)), []).append(text)

    def texts(self) -> dict[int, str]:
        return {i: "".join(parts) for i, parts in self.parts.items()}


def token_f1(a: str, b: str) -> float:
    """F1 of the whitespace-token bags of two texts (1.0 for two empty texts)."""
    x, y = Counter(a.split()), Counter(b.split())
    if not x and not y:
        return 1.0
    common = sum((x & y).values())
    if not common:
        return 0.0
    precision, recall = common / sum(y.values()), common / sum(x.values())
    return 2 * precision * recall / (precision + recall)


def agreement(request: dict[str, Any], live: dict[int, str], shadow: dict[int, str]) -> float:
    if is_greedy(request):
        return 1.0 if live == shadow else 0.0
    indexes = sorted(set(live) | set(shadow))
    if not indexes:
        return 1.0
    return sum(token_f1(live.get(i, ""), shadow.get(i, "")) for i in indexes) / len(indexes)


class LlmShadow:
    """Chooses and runs the copies of generation requests (``generation.py`` calls it)."""

    def __init__(self, mirror: ShadowMirror, engines: Any) -> None:
        self.mirror, self.engines = mirror, engines

    def pick(self, ep: EndpointRuntime, route: str, request: dict[str, Any]) -> Copies | None:
        if route not in COMPARED_ROUTES:
            return None
        body = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
        return self.mirror.pick(ep, body)

    def fire(self, copies: Copies | None, live: Target, route: str, texts: dict[int, str]) -> None:
        """Start the copies after the live answer ended; returns at once, never raises."""
        if copies is not None:
            self.mirror.launch(copies, live, lambda target: self._run(copies, target, live, route, texts))

    async def _run(self, copies: Copies, target: Target, live: Target, route: str, texts: dict[int, str]) -> None:
        t0 = time.perf_counter()
        status, score, answer, error = 500, None, None, None
        try:
            answer = await self.engines[copies.ep.engine].post(target, route, {**copies.request, "stream": False})
            status = 200
            score = agreement(copies.request, texts, choice_texts(answer))
        except ServingError as exc:
            status, error = exc.status, exc.message
        except Exception as exc:
            error = f"internal error ({type(exc).__name__})"
            log.exception("LLM shadow copy to %s version %s failed", copies.ep.name, target.version)
        latency = time.perf_counter() - t0
        self.mirror.logged(copies.ep, target, copies.request, completions(choice_texts(answer)) if answer else None,
                           status, latency, error=error, usage=(answer or {}).get("usage"))
        self.mirror.record(copies.ep, target, live, status, latency, {"inference": latency},
                           {"agree": None if score is None else score == 1.0, "mad": None, "agreement": score})
