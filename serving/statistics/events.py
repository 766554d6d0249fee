"""The per-request statistics event and the batch envelope both transports carry.

Workers build plain dicts (cheap on the request path); the statistics service turns
them into :class:`StatisticsEvent` with lenient parsing, because a malformed event
from one worker must cost one counter increment, never the whole batch.

Wire format (embedded HTTP body and Kafka message value are the same bytes)::

    {"schema": "serving.statistics/v1", "source": "host:pid", "dropped": 0,
     "events": [{"ts": 1718000000.1, "endpoint": "sentiment", "version": 1,
                 "status": 200, "latency_s": 0.0123,
                 "stages": {"preprocess": 0.001, "inference": 0.01, "postprocess": 0.0003},
                 "custom": {"tokens": 17, "label": "POSITIVE"}}]}

A copy of a request served by a shadow version (serving/worker/shadow.py) is an event
of that version with a ``shadow`` object: the version that answered the client, whether
the two answers agree, their mean absolute (logit) difference, or that the copy was
dropped (the shadow was too slow)::

    {"endpoint": "sentiment", "version": 2, "status": 200, "latency_s": 0.02, ...,
     "shadow": {"live_version": 1, "agree": true, "mad": 0.013}}

With client keys required (serving/worker/client_keys.py), an event carries the key's name
(``"key": "alice"``, never the key); a request the key check refused is an event of its own
with the reason (``"refused": "missing_key" | "invalid_key" | "endpoint_scope" | "rate"``),
counted apart from the endpoint's requests.

A worker process also reports what its model loads came to (serving/worker/gate.py): each failed
attempt to load a version, a version once it takes traffic there, and one it no longer routes to nor
fails on (``retired``). Such an event counts in the model-load series only, never as a request
(``reason``: which part failed, ``model`` or ``preprocess``)::

    {"ts": 1718000000.1, "endpoint": "sentiment", "version": 2,
     "model_state": {"state": "failed", "model": "clf", "engine": "onnxruntime", "reason": "model"}}

A generation request to an LLM endpoint (serving/llm/relay/generation.py) carries its timings and token
counts in ``llm`` (docs/llm-statistics.md; ``ttft_s`` is None for a non-streaming request)::

    {"endpoint": "chat", "version": 1, "status": 200, "latency_s": 0.41, ...,
     "llm": {"ttft_s": 0.05, "itl_s": [0.012, 0.011], "e2e_s": 0.41, "prompt_tokens": 9,
             "completion_tokens": 3, "finish_reason": "length", "stream": true}}

``dropped`` is the sender's cumulative count of events it had to discard (queue
full, send failures), so the service can export losses it never saw.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from serving.embeddings.events import EmbeddingCounts, parse_embedding
from serving.statistics.llm_events import LlmTiming, parse_llm
from serving.statistics.torchserve_events import TorchServeTiming, parse_torchserve

SCHEMA = "serving.statistics/v1"
STAGES = ("preprocess", "inference", "postprocess")
LOAD_STATES = ("ready", "failed", "retired")
LOAD_REASONS = ("model", "preprocess")  # the engine loading the model, or building its preprocessing
OTHER_REASON = "other"  # a reason this service does not know (a newer worker): bounded labels


class EventError(ValueError):
    """One event (or one envelope) could not be understood."""


@dataclass(frozen=True)
class StatisticsEvent:
    endpoint: str
    version: int | None
    status: int
    latency_s: float
    ts: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    shadow: "ShadowResult | None" = None  # set for copies served by a shadow version
    key: str | None = None      # the client key's name, when workers require keys
    refused: str | None = None  # why the client-key check refused the request (then nothing else ran)
    model_state: "ModelState | None" = None  # a load outcome of a worker process, not a request
    llm: LlmTiming | None = None  # a generation request's timings and token counts
    embedding: EmbeddingCounts | None = None  # an encoder request's texts, tokens and batches
    torchserve: TorchServeTiming | None = None  # a TorchServe archive's request: its batch, queue time, metrics
    prediction_log: "PredictionLogCounts | None" = None  # a worker's prediction-log counts, not a request
    request_id: str | None = None  # the request's X-Request-Id
    prediction: Any = None  # a logged request's answer, {"label"} or {"value"}: feedback joins it (ground_truth.py)

    def to_dict(self) -> dict[str, Any]:
        out = {"ts": self.ts, "endpoint": self.endpoint, "version": self.version,
               "status": self.status, "latency_s": self.latency_s,
               "stages": dict(self.stages), "custom": dict(self.custom)}
        if self.shadow is not None:
            out["shadow"] = self.shadow.to_dict()
        if self.key is not None:
            out["key"] = self.key
        if self.refused is not None:
            out["refused"] = self.refused
        if self.model_state is not None:
            out["model_state"] = self.model_state.to_dict()
        if self.llm is not None:
            out["llm"] = self.llm.to_dict()
        if self.embedding is not None:
            out["embedding"] = self.embedding.to_dict()
        if self.torchserve is not None:
            out["torchserve"] = self.torchserve.to_dict()
        if self.request_id is not None:
            out["request_id"] = self.request_id
        if self.prediction is not None:
            out["prediction"] = self.prediction
        if self.prediction_log is not None:
            out["prediction_log"] = {"written": self.prediction_log.written, "dropped": self.prediction_log.dropped}
        return out


@dataclass(frozen=True)
class PredictionLogCounts:
    """Records a worker process wrote to its prediction log's sink, and dropped, since its last report."""

    written: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class ModelState:
    """A worker process's load outcome for one model version: ``failed`` (one attempt), ``ready`` (it
    takes traffic there) or ``retired`` (neither routed nor failing there any more)."""

    state: str                 # one of LOAD_STATES
    model: str = "none"
    engine: str = "none"
    reason: str | None = None  # failed: one of LOAD_REASONS, or OTHER_REASON

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "model": self.model, "engine": self.engine, "reason": self.reason}


def _model_state(value: Any) -> ModelState | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EventError("model_state is not an object")
    state = value.get("state")
    if state not in LOAD_STATES:
        raise EventError(f"model_state.state must be one of {', '.join(LOAD_STATES)}: {state!r}")
    reason = None
    if state == "failed":
        reason = value.get("reason") if value.get("reason") in LOAD_REASONS else OTHER_REASON
    return ModelState(state=state, model=_label(value.get("model"), "model_state.model") or "none",
                      engine=_label(value.get("engine"), "model_state.engine") or "none", reason=reason)


@dataclass(frozen=True)
class ShadowResult:
    live_version: int | None = None
    agree: bool | None = None   # None: not compared (the copy failed, or nothing comparable)
    mad: float | None = None    # mean absolute difference of logits / numbers
    dropped: bool = False       # not run: too many copies already under way
    agreement: float | None = None  # LLM copies: 1.0/0.0 exact text (greedy), else token overlap in [0, 1]
    cosine: float | None = None  # embedding copies: the lowest cosine similarity to the live vectors, in [-1, 1]

    def to_dict(self) -> dict[str, Any]:
        out = {"live_version": self.live_version, "agree": self.agree, "mad": self.mad, "dropped": self.dropped}
        if self.cosine is not None:
            out["cosine"] = self.cosine
        return out if self.agreement is None else {**out, "agreement": self.agreement}


def _shadow(value: Any) -> ShadowResult | None:
    if value is None or value is False:
        return None
    if value is True:
        return ShadowResult()
    if not isinstance(value, dict):
        raise EventError("shadow is not an object")
    agree = value.get("agree")
    mad = value.get("mad")
    return ShadowResult(live_version=_version(value.get("live_version")),
                        agree=None if agree is None else bool(agree),
                        mad=None if mad is None else _finite(mad, "shadow.mad"),
                        dropped=bool(value.get("dropped")), agreement=_agreement(value.get("agreement")),
                        cosine=_cosine(value.get("cosine")))


def _cosine(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise EventError(f"shadow.cosine is not a number: {value!r}") from exc
    if not -1.0 <= number <= 1.0:
        raise EventError("shadow.cosine must be between -1 and 1")
    return number


def _agreement(value: Any) -> float | None:
    if value is None:
        return None
    score = _finite(value, "shadow.agreement")
    if not 0.0 <= score <= 1.0:
        raise EventError("shadow.agreement must be between 0 and 1")
    return score


@dataclass(frozen=True)
class Batch:
    events: list[dict[str, Any]]
    source: str = ""
    dropped: int = 0


def _finite(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise EventError(f"{name} is not a number: {value!r}") from exc
    if not math.isfinite(number) or number < 0:
        raise EventError(f"{name} must be finite and >= 0: {value!r}")
    return number


def _version(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise EventError(f"version is not an integer: {value!r}") from exc


def _stages(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {k: _finite(v, f"stages.{k}") for k, v in value.items() if k in STAGES and v is not None}


def parse_event(raw: Any) -> StatisticsEvent:
    """Validate one event dict; raises :class:`EventError` on anything unusable."""
    if not isinstance(raw, dict):
        raise EventError("event is not an object")
    endpoint = raw.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise EventError("endpoint missing")
    try:
        status = int(raw.get("status", 200))
    except (TypeError, ValueError) as exc:
        raise EventError("status is not an integer") from exc
    custom = raw.get("custom") or {}
    return StatisticsEvent(
        endpoint=endpoint, version=_version(raw.get("version")), status=status,
        latency_s=_finite(raw.get("latency_s", 0.0), "latency_s"),
        ts=float(raw.get("ts") or 0.0), stages=_stages(raw.get("stages")),
        custom=custom if isinstance(custom, dict) else {}, shadow=_shadow(raw.get("shadow")),
        key=_label(raw.get("key"), "key"), refused=_label(raw.get("refused"), "refused"),
        model_state=_model_state(raw.get("model_state")), llm=parse_llm(raw.get("llm")),
        embedding=parse_embedding(raw.get("embedding")), torchserve=parse_torchserve(raw.get("torchserve")),
        prediction_log=_prediction_log(raw.get("prediction_log")),
        request_id=_request_id(raw.get("request_id")), prediction=raw.get("prediction"),
    )


def _request_id(value: Any) -> str | None:
    """The worker chose it (serving/worker/request_ids.py); anything else is ignored, not refused."""
    return value if isinstance(value, str) and 0 < len(value) <= 128 else None


def _prediction_log(value: Any) -> PredictionLogCounts | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EventError("prediction_log is not an object")
    counts = [value.get("written", 0), value.get("dropped", 0)]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise EventError(f"prediction_log counts must be whole numbers of 0 or more: {value!r}")
    return PredictionLogCounts(*counts)


def _label(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 128:
        raise EventError(f"{name} must be a name of 1 to 128 characters: {value!r}")
    return value


def _default(obj: Any) -> Any:
    """Serialize numpy scalars and anything else a preprocessor may report."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    return str(obj)


def encode_batch(events: list[dict[str, Any]], source: str = "", dropped: int = 0) -> bytes:
    envelope = {"schema": SCHEMA, "source": source, "dropped": dropped, "events": events}
    return orjson.dumps(envelope, default=_default, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_batch(data: bytes | str) -> Batch:
    """Parse an envelope; a bare JSON list of events is accepted too (hand-made tests, curl)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"not JSON: {exc}") from exc
    if isinstance(doc, list):
        return Batch(events=doc)
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        raise EventError("envelope has no events list")
    schema = doc.get("schema", SCHEMA)
    if not str(schema).startswith("serving.statistics/v1"):
        raise EventError(f"unsupported schema {schema!r}")
    return Batch(events=doc["events"], source=str(doc.get("source", "")),
                 dropped=int(doc.get("dropped") or 0))
