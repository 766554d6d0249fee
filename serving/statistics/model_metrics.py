"""Model loads as worker processes saw them (events from serving/worker/gate.py), and the
embedded Triton's failed loads (serving/triton/embedded.py: once per failure, not per retry).

``serving_model_load_failures_total`` counts attempts: each time one worker process tried to load
a version (the engine opening its model, or building its preprocessing) and failed. A version that
stays in the config is tried again at each config the process applies, and each of those attempts
counts again; N worker processes failing on one deploy count N.

``serving_model_ready`` is 1 while worker processes route traffic to the version, 0 after an attempt
to load it failed: the last outcome any worker process reported (they agree unless a load fails on
some processes only). A version the workers retired (replaced, or its endpoint fixed) is no longer
exported; nor, once the config has moved on, a failed version it no longer has (nobody retries it),
nor any version of an endpoint the config no longer has. A version the config replaced keeps its 1
while workers still route to it: the old routes of a deploy that failed or is not ready yet.

Labels are bounded: endpoint, model and version of the config, the engine name, and a reason
class (``model``, ``preprocess``, ``other``), never the error text (it is in
``serving endpoint status``).
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

from serving.statistics.definitions import EndpointDefs
from serving.statistics.events import StatisticsEvent
from serving.statistics.metrics import version_label

Labels = tuple[str, str, str]  # endpoint, model, version


class ModelMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter("serving_model_load_failures",
                                "Failed attempts of a worker process to load a model version, by reason "
                                "(model: the engine could not load it; preprocess: its tokenizer or user code).",
                                ["endpoint", "model", "version", "engine", "reason"], registry=registry)
        self.ready = Gauge("serving_model_ready", "1 while worker processes route traffic to the version, "
                           "0 after a failed attempt to load it (the last outcome reported).",
                           ["endpoint", "model", "version"], registry=registry)
        self._exported: dict[Labels, bool] = {}  # labels -> ready
        self._lock = threading.Lock()

    def observe(self, event: StatisticsEvent) -> bool:
        """Count the event; True when it was a load outcome (nothing else is to be counted of it)."""
        outcome = event.model_state
        if outcome is None:
            return False
        labels = (event.endpoint, outcome.model, version_label(event.version))
        with self._lock:
            if outcome.state == "retired":
                if self._exported.pop(labels, None) is not None:
                    self.ready.remove(*labels)
                return True
            if outcome.state == "failed":
                self.failures.labels(*labels, outcome.engine, outcome.reason or "other").inc()
            ready = outcome.state == "ready"
            self.ready.labels(*labels).set(1.0 if ready else 0.0)
            self._exported[labels] = ready
        return True

    def retain(self, defs: dict[str, EndpointDefs]) -> None:
        """After a config change: forget the endpoints it no longer has, and the failed versions it no
        longer has (the failure counters stay: counters only grow)."""
        with self._lock:
            for labels, ready in list(self._exported.items()):
                endpoint = defs.get(labels[0])
                if endpoint is None or not (ready or not endpoint.versions or labels[2] in endpoint.versions):
                    self.ready.remove(*labels)
                    del self._exported[labels]
