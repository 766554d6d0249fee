"""Shadow traffic: a copy of a share of an endpoint's requests goes to a candidate version.

A shadow is an endpoint target with ``role == "shadow"``; its ``weight`` is the percent of
requests copied to it. Routing never picks it for an answer (``canary_split.choose``). The data
plane asks :meth:`ShadowMirror.pick` which shadows get a copy before it serves a request, and
hands the live answer to :meth:`ShadowMirror.fire` once it has it; the copy then runs in the
background (an asyncio task on the worker's loop) through the same preprocess -> engine ->
postprocess as a live request of the shadow version, its answer is compared with the live one,
and one statistics event marked ``"shadow"`` is recorded. The client's answer and latency never
depend on the copy: ``fire`` only schedules it and never raises.

Bounded: at most ``max_in_flight`` copies run at once in a worker process. When the shadow is
slower than the live version, further copies are dropped (and recorded as dropped), never queued.

Comparison (``compare``): answers with labels (the built-in tokenizer's ``label``/``logits``,
one or ``predictions``) agree when every label is the same, and ``mad`` is the mean absolute
difference of their logits; any other answer agrees when it is the same JSON, and ``mad`` is the
mean absolute difference of its numbers when both have the same count. v2 tensors agree when
the argmax over the last axis of every output is the same (a classifier's label). Embeddings
(an encoder endpoint's ``embedding``/``embeddings``) agree when every pair of vectors has a cosine
similarity of at least ``COSINE_AGREE``, and the event carries the lowest (``cosine``); a
cross-encoder's ``scores`` agree when they rank the texts in the same order.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import numpy as np
import orjson

from preprocess.base import PreprocessError, UserCodeTimeout
from serving.embeddings.batching import encoder_of
from serving.worker.errors import ServingError
from serving.worker.runtime import EndpointRuntime, Target

# The data plane hands the mirror what it needs (so this module does not import the data plane):
# its pinned run of one target (preprocessed data in, (target, outputs) out), its engines by name,
# and where statistics events go (read at each copy: the recorder may be set after start).
RunTarget = Callable[..., Awaitable[tuple[Target, Any]]]


log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16  # copies running at once per worker process; more are dropped
COSINE_AGREE = 0.99  # two embeddings of a text agree at or above this cosine similarity


@dataclass
class Copies:
    """The shadows chosen for one request, and what they will be sent."""

    ep: EndpointRuntime
    targets: list[Target]
    request: Any  # the request body (/serve) or the input tensors (v2)
    tensors: bool = False


class ShadowMirror:
    def __init__(self, run: RunTarget, engines: Mapping[str, Any], recorder: Callable[[], Any],
                 max_in_flight: int = MAX_IN_FLIGHT, rand: Callable[[], float] = random.random) -> None:
        self.run_target, self.engines, self.recorder = run, engines, recorder
        self.max_in_flight = max_in_flight
        self.rand = rand
        self.in_flight = 0
        self.sent = self.dropped = 0
        self._tasks: set[asyncio.Task] = set()
        # the prediction log's record of a copy (prediction_capture.py): (ep, target, request, answer,
        # status, latency_s, error=..., usage=...)
        self.logged: Callable[..., None] = lambda *args, **kwargs: None

    # --- request path ---------------------------------------------------------------
    def pick(self, ep: EndpointRuntime, request: Any, tensors: bool = False) -> Copies | None:
        """Which shadows get a copy of this request (each independently, with its share).
        A user's preprocess may change the body it gets, so the copy gets its own body."""
        try:
            shadows = ep.shadows
            if not shadows or self.recorder() is None:  # nothing would see the comparison
                return None
            chosen = [t for t in shadows if self.rand() * 100.0 < t.weight]
            if not chosen:
                return None
            if not tensors and ep.preprocess_kind == "user" and not isinstance(request, (bytes, str)):
                request = copy.deepcopy(request)
            return Copies(ep, chosen, request, tensors)
        except Exception:  # never the client's problem
            log.exception("shadow: choosing copies failed")
            return None

    def fire(self, copies: Copies | None, live: Target, answer: Any) -> None:
        """Start the copies in the background; returns at once, never raises."""
        if copies is not None:
            self.launch(copies, live, lambda target: self._run(copies, target, live, answer))

    def launch(self, copies: Copies, live: Target, run: Callable[[Target], Awaitable[None]]) -> None:
        """``run(target)`` for each chosen shadow as a background task, within the in-flight bound
        (a copy past it is dropped and recorded as dropped); returns at once, never raises.
        The generation path (llm/shadow_compare.py) brings its own ``run``."""
        try:
            loop = asyncio.get_running_loop()
            for target in copies.targets:
                if self.in_flight >= self.max_in_flight:
                    self.dropped += 1
                    self.record(copies.ep, target, live, 0, 0.0, {}, {"dropped": True})
                    continue
                self.in_flight += 1
                self.sent += 1
                task = loop.create_task(run(target))
                self._tasks.add(task)
                task.add_done_callback(self._done)
        except Exception:
            log.exception("shadow: starting a copy failed")

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.in_flight -= 1

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait for the copies under way (tests, shutdown)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    # --- the copy -----------------------------------------------------------------
    async def _run(self, copies: Copies, target: Target, live: Target, live_answer: Any) -> None:
        t0 = mark = time.perf_counter()
        stages: dict[str, float] = {}

        def stage(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            stages[name], mark = now - mark, now

        status, answer, error = 500, None, None
        try:
            if copies.tensors:
                _, answer = await self.run_target(copies.ep, target, copies.request, pinned=True)
                stage("inference")
            else:
                answer = await self._serve(copies.ep, target, copies.request, stage)
            status = 200
        except UserCodeTimeout as exc:
            status, error = 504, str(exc)
        except PreprocessError as exc:
            status, error = 422, str(exc)
        except ServingError as exc:
            status, error = exc.status, exc.message
        except Exception as exc:
            error = f"internal error ({type(exc).__name__})"
            log.exception("shadow copy to %s version %s failed", copies.ep.name, target.version)
        latency = time.perf_counter() - t0
        self.logged(copies.ep, target, copies.request, answer, status, latency, error=error)
        result: dict[str, Any] = {"agree": None, "mad": None}
        if status == 200:
            try:
                result["agree"], result["mad"] = (compare_tensors if copies.tensors else compare)(live_answer, answer)
                cosine = None if copies.tensors else embedding_cosine(live_answer, answer)
                if cosine is not None:
                    result["cosine"] = cosine
            except Exception:
                log.exception("shadow: comparing answers failed")
        self.record(copies.ep, target, live, status, latency, stages, result)

    async def _serve(self, ep: EndpointRuntime, target: Target, body: Any, stage: Callable[[str], None]) -> Any:
        """The data plane's preprocess -> engine -> postprocess, for the shadow version only."""
        from preprocess.tensors import clearml_outputs

        state: dict[str, Any] = {}
        ignore = _ignore
        processor = ep.processor_for(target)
        engine = self.engines[ep.engine]
        data = await processor.preprocess(body, state, ignore)
        stage("preprocess")
        if engine.kind == "python":
            data = await engine.run(target, processor, data, state, ignore)
        else:
            _, outputs = await self.run_target(ep, target, data, pinned=True,
                                               pad=getattr(processor, "pad_values", None),
                                               encoder=encoder_of(processor))
            data = outputs if processor.outputs_form == "dict" else clearml_outputs(outputs, ep.declared_outputs)
        stage("inference")
        answer = await processor.postprocess(data, state, ignore)
        stage("postprocess")
        return answer

    def record(self, ep: EndpointRuntime, target: Target, live: Target, status: int, latency: float,
                stages: dict[str, float], result: dict[str, Any]) -> None:
        recorder = self.recorder()
        if recorder is None:
            return
        recorder.record({"ts": time.time(), "endpoint": ep.name, "version": target.version, "status": status,
                         "latency_s": latency, "stages": stages, "custom": {},
                         "shadow": {"live_version": live.version, **result}})


def _ignore(values: Any) -> None:
    """A shadow's custom statistics are not the endpoint's: they would count twice."""


# --- comparison -----------------------------------------------------------------------
def _field(answer: Any, name: str) -> list[Any] | None:
    """``answer[name]`` of a tokenizer-style answer, one per prediction; None if it has none."""
    if isinstance(answer, dict) and name in answer:
        return [answer[name]]
    if isinstance(answer, dict) and isinstance(answer.get("predictions"), list):
        items = answer["predictions"]
        if items and all(isinstance(p, dict) and name in p for p in items):
            return [p[name] for p in items]
    return None


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return []
    if isinstance(value, (int, float, np.number)):
        return [float(value)]
    if isinstance(value, np.ndarray):
        return [float(v) for v in value.ravel()] if value.dtype.kind in "fiu" else []
    if isinstance(value, dict):
        return [n for k in sorted(value, key=str) for n in _numbers(value[k])]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _numbers(v)]
    return []


def mean_abs_diff(a: Any, b: Any) -> float | None:
    x, y = _numbers(a), _numbers(b)
    if not x or len(x) != len(y):
        return None
    mad = float(np.mean(np.abs(np.asarray(x) - np.asarray(y))))
    return mad if math.isfinite(mad) else None


def _json(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)


def _vectors(answer: Any) -> np.ndarray | None:
    """An encoder endpoint's embeddings as rows, or None for any other answer."""
    if not isinstance(answer, dict):
        return None
    value = answer.get("embeddings", answer.get("embedding"))
    if value is None:
        return None
    rows = np.asarray(value, dtype=np.float64)
    return rows.reshape(1, -1) if rows.ndim == 1 else rows


def embedding_cosine(live: Any, shadow: Any) -> float | None:
    """The lowest cosine similarity between the two answers' embeddings of the same text (None: not
    embeddings, or of different shapes: a shadow of other dimensions cannot be compared)."""
    a, b = _vectors(live), _vectors(shadow)
    if a is None or b is None or a.shape != b.shape or not a.size:
        return None
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = float(np.min((a * b).sum(axis=1) / np.maximum(norms, 1e-12)))
    return max(-1.0, min(1.0, cosine)) if math.isfinite(cosine) else None


def compare(live: Any, shadow: Any) -> tuple[bool, float | None]:
    """(agree, mean absolute difference) of two /serve answers."""
    cosine = embedding_cosine(live, shadow)
    if cosine is not None:
        return cosine >= COSINE_AGREE, mean_abs_diff(_vectors(live), _vectors(shadow))
    if isinstance(live, dict) and isinstance(shadow, dict) and "scores" in live and "scores" in shadow:
        a, b = np.asarray(live["scores"], dtype=np.float64), np.asarray(shadow["scores"], dtype=np.float64)
        if a.shape == b.shape:
            return bool(np.array_equal(np.argsort(-a, kind="stable"), np.argsort(-b, kind="stable"))), mean_abs_diff(a, b)
    live_labels, shadow_labels = _field(live, "label"), _field(shadow, "label")
    if live_labels is not None and shadow_labels is not None:
        live_logits, shadow_logits = _field(live, "logits"), _field(shadow, "logits")
        mad = mean_abs_diff(live_logits, shadow_logits) if live_logits and shadow_logits else None
        return live_labels == shadow_labels, mad
    return _json(live) == _json(shadow), mean_abs_diff(live, shadow)


def compare_tensors(live: dict[str, np.ndarray], shadow: dict[str, np.ndarray]) -> tuple[bool, float | None]:
    """(agree, mean absolute difference) of two v2 outputs: argmax over the last axis of each output."""
    names = sorted(set(live) & set(shadow))
    agree = bool(names) and set(live) == set(shadow)
    for name in names:
        a, b = np.asarray(live[name]), np.asarray(shadow[name])
        if a.shape != b.shape:
            agree = False
        elif a.ndim and a.size and not np.array_equal(np.argmax(a, axis=-1), np.argmax(b, axis=-1)):
            agree = False
    same = [n for n in names if np.shape(live[n]) == np.shape(shadow[n])]
    mad = mean_abs_diff([live[n] for n in same], [shadow[n] for n in same]) if same else None
    return agree, mad
