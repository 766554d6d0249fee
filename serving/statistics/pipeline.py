"""Turns received batches into metrics and drift state; transport-agnostic.

The embedded HTTP endpoint and the Kafka consumer both call
:meth:`StatisticsPipeline.handle_payload`, so the two transports cannot disagree
on what an event means. Variable definitions come from control-plane snapshots;
custom values for undeclared variables are ignored (ClearML Serving does the same).
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from serving.statistics.definitions import EndpointDefs, VariableDef, parse_snapshot
from serving.statistics.drift import DriftConfig, DriftMonitor, SeriesKey
from serving.embeddings.metrics import EmbeddingMetrics
from serving.statistics.events import Batch, EventError, StatisticsEvent, decode_batch, parse_event
from serving.statistics.exporter import DriftCollector
from serving.statistics.key_metrics import KeyMetrics
from serving.statistics.llm_metrics import LlmMetrics
from serving.statistics.metrics import RequestMetrics, ShadowMetrics, VariableMetrics, version_label
from serving.statistics.ground_truth import GroundTruth
from serving.statistics.model_metrics import ModelMetrics
from serving.statistics.prediction_log_metrics import PredictionLogMetrics
from serving.statistics.references import ANY_VERSION, Reference, ReferenceStore
from serving.statistics.torchserve_metrics import TorchServeMetrics

log = logging.getLogger(__name__)


class StatisticsPipeline:
    def __init__(self, registry: CollectorRegistry, drift: DriftConfig = DriftConfig(),
                 references: ReferenceStore | None = None, truth: GroundTruth | None = None) -> None:
        self.requests = RequestMetrics(registry)
        self.shadows = ShadowMetrics(registry)
        self.keys = KeyMetrics(registry)
        self.models = ModelMetrics(registry)
        self.prediction_log = PredictionLogMetrics(registry)
        self.truth = truth or GroundTruth(registry)  # feedback joined to logged predictions (ground_truth.py)
        self.llm = LlmMetrics(registry)
        self.embeddings = EmbeddingMetrics(registry)
        self.torchserve = TorchServeMetrics(registry)
        self.variables = VariableMetrics()
        self.drift = DriftMonitor(drift)
        self.drift.on_reference_complete = self._learned
        self.references = references
        registry.register(self.variables)
        registry.register(DriftCollector(self.drift))
        self.ingested = Counter("serving_statistics_events", "Events received by the statistics service.",
                                ["result"], registry=registry)
        self.dropped = Counter("serving_statistics_dropped_events",
                               "Events workers discarded before sending (queue full, transport down).",
                               registry=registry)
        self.defs: dict[str, EndpointDefs] = {}
        self.revision: int | None = None
        self._sources: dict[str, int] = {}
        self._seen: set[SeriesKey] = set()
        self._lock = threading.Lock()

    # --- configuration ------------------------------------------------------------
    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        self.defs = parse_snapshot(snapshot)
        self.revision = int(snapshot.get("revision", 0))
        self.variables.retain(self._configured)
        self.drift.retain(self._configured)
        self.models.retain(self.defs)
        with self._lock:
            self._seen = {k for k in self._seen if self._configured(k)}
        log.info("statistics: config revision %s, %d endpoints", self.revision, len(self.defs))

    def _configured(self, key: SeriesKey) -> bool:
        defs = self.defs.get(key[0])
        return defs is not None and defs.keeps(key[1], key[2])

    # --- ingestion ----------------------------------------------------------------
    def handle_payload(self, data: bytes) -> int:
        """Ingest one envelope; raises EventError only if the envelope itself is bad."""
        batch = decode_batch(data)
        return self.handle_batch(batch)

    def handle_message(self, data: bytes) -> None:
        """For consumers: like handle_payload but never raises."""
        try:
            self.handle_payload(data)
        except EventError as exc:
            log.warning("ignoring statistics message: %s", exc)
            self.ingested.labels("invalid").inc()

    def handle_batch(self, batch: Batch) -> int:
        self._count_dropped(batch)
        accepted = 0
        for raw in batch.events:
            try:
                self.handle_event(parse_event(raw))
                accepted += 1
            except EventError as exc:
                log.debug("invalid statistics event: %s", exc)
                self.ingested.labels("invalid").inc()
        self.ingested.labels("accepted").inc(accepted)
        return accepted

    def _count_dropped(self, batch: Batch) -> None:
        """Senders report a cumulative count; add the increase (a restart resets it)."""
        if not batch.source:
            return
        with self._lock:
            last = self._sources.get(batch.source, 0)
            self._sources[batch.source] = batch.dropped
        increase = batch.dropped - last if batch.dropped >= last else batch.dropped
        if increase > 0:
            self.dropped.inc(increase)

    def handle_event(self, event: StatisticsEvent) -> None:
        if self.models.observe(event):  # a load outcome, not a request: its own series only
            return
        if self.prediction_log.observe(event):  # a worker's prediction-log counts, not a request
            return
        if self.keys.observe(event):  # refused by the client-key check: counted there only
            return
        if event.shadow is not None:  # a copy: its own series only, no live counts, variables or drift
            self.shadows.observe(event)
            return
        self.requests.observe(event)
        if event.request_id is not None and event.prediction is not None:
            self.truth.remember(event.request_id, event.endpoint, event.version, event.prediction)
        self.llm.observe(event)
        self.embeddings.observe(event.endpoint, event.version, event.embedding)
        self.torchserve.observe(event.endpoint, event.version, event.latency_s, event.torchserve)
        defs = self.defs.get(event.endpoint)
        if defs is None or not event.custom:
            return
        version = version_label(event.version)
        for name, raw in event.custom.items():
            definition = defs.variables.get(name)
            if definition is None:
                continue
            for item in raw if isinstance(raw, (list, tuple)) else (raw,):
                self._observe((event.endpoint, version, name), definition, item)

    def _observe(self, key: SeriesKey, definition: VariableDef, value: Any) -> None:
        if key not in self._seen:
            self._first_sight(key, definition)
        self.variables.observe(key, definition, value)
        self.drift.add(key, definition.kind, value)

    # --- references ---------------------------------------------------------------
    def _first_sight(self, key: SeriesKey, definition: VariableDef) -> None:
        """A version's first value of a variable: install a stored reference if any."""
        with self._lock:
            self._seen.add(key)
        if self.references is None:
            return
        endpoint, version, variable = key
        ref = self.references.get(endpoint, version, variable) or self.references.get(endpoint, ANY_VERSION, variable)
        if ref is not None and ref.kind == definition.kind:
            self.drift.set_reference(key, ref.kind, ref.values, uploaded=ref.uploaded)

    def _learned(self, key: SeriesKey, kind: str, values: list[Any]) -> None:
        if self.references is not None:
            self.references.save(Reference(*key, kind=kind, values=values, uploaded=False))

    def upload_reference(self, endpoint: str, version: str, variable: str, values: list[Any]) -> Reference:
        """Install an uploaded reference; version ``*`` applies to every version without its own."""
        definition = self._definition(endpoint, variable)
        ref = Reference(endpoint, version, variable, definition.kind, list(values), uploaded=True)
        if self.references is not None:
            self.references.save(ref)
        for key in self._keys(endpoint, version, variable):
            if version == ANY_VERSION and self._has_own_upload(key):
                continue
            self.drift.set_reference(key, definition.kind, values, uploaded=True)
        return ref

    def _has_own_upload(self, key: SeriesKey) -> bool:
        own = self.references.get(*key) if self.references is not None else None
        return own is not None and own.uploaded

    def reset_reference(self, endpoint: str, version: str, variable: str) -> None:
        """Forget a reference: the next values the version reports form a new one."""
        if self.references is not None:
            self.references.delete(endpoint, version, variable)
        for key in self._keys(endpoint, version, variable):
            self.drift.reset(key)

    def _keys(self, endpoint: str, version: str, variable: str) -> list[SeriesKey]:
        with self._lock:
            return [k for k in self._seen
                    if k[0] == endpoint and k[2] == variable and version in (ANY_VERSION, k[1])]

    def _definition(self, endpoint: str, variable: str) -> VariableDef:
        definition = self.defs.get(endpoint, EndpointDefs(endpoint)).variables.get(variable)
        if definition is None:
            raise KeyError(f"endpoint {endpoint!r} declares no variable {variable!r}")
        return definition
