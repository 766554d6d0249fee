"""The protocol-agnostic data plane: every front end (``/serve`` REST, v2) calls this.

One request: resolve the endpoint in the current config, route to a model version
(canary weights, sticky routing key, or an explicit version), preprocess, run the
engine, postprocess, and hand one statistics event to the recorder. Front ends
only translate their wire format; errors are :class:`ServingError` subclasses that
carry their HTTP status, so every protocol reports them the same way.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from preprocess.base import InputOutOfRange, PreprocessError
from preprocess.tensors import clearml_outputs, to_model_inputs
from serving.tracing import spans
from serving.worker import canary_split, request_ids
from serving.worker.client_keys import ClientKeys
from serving.embeddings.batching import EncoderBatching, encoder_of
from serving.worker.engines.base import Engine
from serving.worker.errors import BadRequest, ModelNotReady, NotFound, UnknownEndpoint, Unavailable, Unprocessable
from serving.worker.lifecycle import RequestLife, RequestStats, request_life
from serving.worker.load import InFlight
from serving.worker.feedback import FeedbackClient
from serving.worker.prediction_capture import PredictionCapture
from serving.prediction_log.prediction import predicted
from serving.worker.runtime import Config, EndpointRuntime, Target
from serving.worker.shadow import ShadowMirror
from serving.worker.version_stats import VersionStatistics


UNKNOWN_ENDPOINT = "(unknown)"  # refusal statistics of endpoints this worker does not serve


class ConfigSource(Protocol):
    current: Config


class Recorder(Protocol):
    def record(self, event: dict[str, Any]) -> None: ...


@dataclass
class Answer:
    target: Target
    body: Any


class DataPlane:
    def __init__(self, config: ConfigSource, engines: Mapping[str, Engine], recorder: Recorder | None = None) -> None:
        self.config = config
        self.engines = engines
        self.recorder = recorder
        # copies to shadow versions, after the live answer (shadow.py)
        self.shadow = ShadowMirror(self._run, self.engines, lambda: self.recorder)
        self.keys = ClientKeys(on_refusal=self.refuse)  # front ends call keys.check (client_keys.py)
        self.version_stats = VersionStatistics()  # Triton's statistics extension (version_stats.py)
        self.encoders = EncoderBatching(lambda: self.config.current)  # encoder endpoints' token batchers
        self.predictions = PredictionCapture(config)  # the prediction log's records (prediction_capture.py)
        self.shadow.logged = self.predictions.shadow
        self.feedback_client: FeedbackClient | None = None  # set by the app: ground truth goes to statistics
        self.in_flight = InFlight()  # requests whose life has begun and not ended: the autoscaling signal (load.py)

    # --- lookups ------------------------------------------------------------------
    def endpoint(self, name: str, config: Config | None = None) -> EndpointRuntime:
        config = config or self.config.current
        ep = config.endpoints.get(name)
        if ep is not None:
            return ep
        if name in config.errors:
            raise Unavailable(f"endpoint {name!r} failed to load: {config.errors[name]}", retry_after_s=5)
        if not config.loaded:
            raise Unavailable("this worker has no configuration yet (control plane unreachable, no cache)")
        known = ", ".join(sorted(config.endpoints)) or "none"
        raise UnknownEndpoint(name, known)

    def route(self, ep: EndpointRuntime, version: int | None, routing_key: str | None) -> Target:
        with spans.span("route", **{"serving.endpoint": ep.name}) as span:
            target = self._route(ep, version, routing_key)
            if span is not None:
                span.set_attribute("serving.version", target.version)
            return target

    def _route(self, ep: EndpointRuntime, version: int | None, routing_key: str | None) -> Target:
        if version is None:
            return canary_split.choose(ep.targets, ep.weights, routing_key)
        target = ep.version(version)
        if target is None:
            serving = ", ".join(str(t.version) for t in ep.targets)
            raise NotFound(f"endpoint {ep.name!r} does not serve version {version} (versions: {serving})")
        return target

    async def ready(self, name: str) -> bool:
        ep = self.endpoint(name)
        engine = self.engines[ep.engine]
        for target in ep.targets:
            if not await engine.ready(target):
                return False
        return True

    # --- inference ----------------------------------------------------------------
    async def infer(self, name: str, body: Any, version: int | None = None, routing_key: str | None = None,
                    client: str | None = None) -> Answer:
        """A request body in, the postprocessed answer out (``/serve``); ``client``: the key's name."""
        ep = self.endpoint(name)
        if self.engines[ep.engine].kind == "llm":  # llm/relay.py's path, through the OpenAI front end
            raise BadRequest(f"endpoint {name!r} serves an LLM: call it with OpenAI's API at /serve/openai/v1/"
                             f"chat/completions or /completions, model {name!r} (docs/llm.md)")
        target = self.route(ep, version, routing_key)
        copies = self.shadow.pick(ep, body) if version is None else None
        with self.life(ep.name, target.version, client) as life:
            stats, state = life.stats, life.state
            if stats.captured is not None:
                stats.captured.inputs = body
            led: list[int] = []  # sizes of the token batches this request headed (encoder endpoints)
            processor = ep.processor_for(target)
            engine = self.engines[ep.engine]
            if getattr(engine, "runs_user_process", False) and getattr(processor, "one_hop", False):
                with spans.span("engine", **{"serving.engine": ep.engine, "serving.version": target.version}):
                    answer = await processor.run_steps(body, state, stats.collect, stats.stage)  # custom: one hop
            else:
                with spans.span("preprocess"):
                    data = await processor.preprocess(body, state, stats.collect)
                stats.stage("preprocess")
                if engine.kind == "python":
                    with spans.span("engine", **{"serving.engine": ep.engine, "serving.version": target.version}):
                        data = await engine.run(target, processor, data, state, stats.collect)
                else:
                    target, outputs = await self._run(ep, target, data, pinned=version is not None,
                                                      pad=getattr(processor, "pad_values", None),
                                                      encoder=encoder_of(processor), led=led)
                    stats.version = target.version
                    data = outputs if processor.outputs_form == "dict" else clearml_outputs(outputs,
                                                                                            ep.declared_outputs)
                stats.stage("inference")
                with spans.span("postprocess"):
                    answer = await processor.postprocess(data, state, stats.collect)
                stats.stage("postprocess")
            self._account(life, processor, led)
            if stats.captured is not None:
                stats.captured.outputs = answer
            self.shadow.fire(copies, target, answer)
            return Answer(target, answer)

    async def infer_tensors(self, name: str, inputs: dict[str, np.ndarray], version: int | None = None,
                            routing_key: str | None = None, client: str | None = None
                            ) -> tuple[Target, dict[str, np.ndarray]]:
        """Named tensors in, model outputs out, no preprocessing (the v2 protocol)."""
        ep = self.endpoint(name)
        target = self.route(ep, version, routing_key)
        if self.engines[ep.engine].kind != "tensors":
            raise BadRequest(f"endpoint {name!r} runs the {ep.engine} engine on its preprocess output, not on "
                             f"tensors; send it JSON on /serve/{name}")
        with self.life(ep.name, target.version, client) as life:
            if life.stats.captured is not None:
                life.stats.captured.inputs = inputs
            try:
                target, outputs = await self._run(ep, target, inputs, pinned=version is not None)
            except InputOutOfRange as exc:  # well-formed, past the model's limits
                raise Unprocessable(str(exc)) from None
            except PreprocessError as exc:  # tensors that do not match the signature
                raise BadRequest(str(exc)) from None
            life.stats.version = target.version
            life.stats.stage("inference")
            if life.stats.captured is not None:
                life.stats.captured.outputs = outputs
            if version is None:
                self.shadow.fire(self.shadow.pick(ep, inputs, tensors=True), target, outputs)
            return target, outputs

    async def feedback(self, name: str, body: Any, client: str | None = None) -> dict[str, Any]:
        """Ground truth for one of the endpoint's requests (feedback.py): the join, or a 4xx naming why not."""
        self.endpoint(name)
        if self.feedback_client is None:
            raise Unavailable("this worker takes no feedback: it has no statistics service")
        return await self.feedback_client.send(name, body, client)

    def life(self, endpoint: str, version: int | None, client: str | None) -> AbstractContextManager[RequestLife]:
        """A request's life on this data plane (lifecycle.py): every path runs in one, the LLM's too."""
        stats = RequestStats(endpoint, version=version, client=client)
        stats.captured = self.predictions.start(endpoint, stats.request_id)
        self.in_flight.begin()
        return request_life(stats, self._ended, self.keys.charge)

    def _ended(self, stats: RequestStats, status: int) -> None:
        self.in_flight.end()
        self._record(stats, status)

    async def _run(self, ep: EndpointRuntime, target: Target, data: Any, pinned: bool,
                   pad: Mapping[str, int] | None = None, encoder: Any = None,
                   led: list[int] | None = None) -> tuple[Target, dict[str, np.ndarray]]:
        """Run the routed version; while a freshly added canary is still loading, its share goes
        to the stable version instead of failing (a pinned ``/serve/E/V`` request still fails).
        ``encoder``: an encoder endpoint's processor, whose rows go through its token batcher and
        come back pooled (preprocess/encoder.py, serving/embeddings/token_batcher.py)."""
        try:
            return target, await self._call(ep, target, data, pad, encoder, led)
        except ModelNotReady:
            fallback = next((t for t in ep.targets if t is not target and t.weight > 0 and not t.shadow), None)
            if pinned or fallback is None:
                raise
            return fallback, await self._call(ep, fallback, data, pad, encoder, led)

    async def _call(self, ep: EndpointRuntime, target: Target, data: Any, pad: Mapping[str, int] | None,
                    encoder: Any, led: list[int] | None) -> dict[str, np.ndarray]:
        engine = self.engines[ep.engine]
        inputs = to_model_inputs(data, target.inputs, ep.declared_inputs)
        with spans.span("engine", **{"serving.engine": ep.engine, "serving.version": target.version}):
            if encoder is None:
                return await engine.infer(target, inputs, pad)
            lengths = np.asarray(data["attention_mask"]).sum(axis=1)
            return await self.encoders.run(ep.name, engine, target, inputs, lengths, pad or {}, encoder, led)

    def _account(self, life: RequestLife, processor: Any, led: list[int]) -> None:
        """An encoder's request: its ``embedding`` counts in the event, with the token batches it
        headed, and its tokens charged to its client key (tokens per minute)."""
        encoder = encoder_of(processor)
        if encoder is None:
            return
        counts = encoder.usage(life.state)
        life.stats.extra["embedding"] = {**counts, "batches": list(led)}
        life.charge_tokens(int(counts["tokens"]))

    def reject(self, name: str, status: int, client: str | None = None) -> None:
        """Count a request a front end refused before inference (bad JSON, body too large), so error
        rates include it; requests for unknown endpoints are not counted (no label to give them)."""
        if name in self.config.current.endpoints:
            stats = RequestStats(name, client=client, error=f"refused with status {status} before inference")
            stats.captured = self.predictions.start(name, stats.request_id)  # what it sent could not be read
            self._record(stats, status)

    def refuse(self, name: str, reason: str, client: str | None, status: int) -> None:
        """Count a request the client-key check refused (client_keys.py): its own series by reason,
        outside the endpoint's request counts and error rate (the model did not fail). An endpoint
        this worker does not serve is counted as ``(unknown)``: callers cannot mint label values."""
        if self.recorder is None:
            return
        endpoint = name if name in self.config.current.endpoints else UNKNOWN_ENDPOINT
        event = {"ts": time.time(), "endpoint": endpoint, "version": None, "status": status, "latency_s": 0.0,
                 "refused": reason}
        if client is not None:
            event["key"] = client
        request_id = request_ids.current()
        if request_id is not None:
            event["request_id"] = request_id
        self.recorder.record(event)

    def _record(self, stats: RequestStats, status: int) -> None:
        self.version_stats.observe(stats.endpoint, stats.version, status, time.perf_counter() - stats.t0,
                                   stats.stages, time.time())
        self.predictions.finish(stats, status)
        if self.recorder is None:
            return
        event = {"ts": time.time(), "endpoint": stats.endpoint, "version": stats.version,
                 "status": status, "latency_s": time.perf_counter() - stats.t0,
                 "stages": stats.stages, "custom": stats.custom}
        if stats.client is not None:
            event["key"] = stats.client
        if stats.request_id is not None:
            event["request_id"] = stats.request_id
        if stats.captured is not None and status == 200:
            prediction = predicted(stats.captured.outputs)  # what feedback will be joined to (ground_truth.py)
            if prediction is not None:
                event["prediction"] = prediction
        event.update(stats.extra)
        self.recorder.record(event)
