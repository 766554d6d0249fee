"""Requests by client key and refusals by reason (client keys: serving/worker/client_keys.py).

Labelled by the key's name, never the key; key names are the admin's (``serving key create``),
so the label sets stay few. Refusals are counted here only, never in ``serving_requests_total``:
a client without a key, or over its rate, is not an error of the model, and must not move an
endpoint's error rate (rollout gates read it).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from serving.statistics.events import StatisticsEvent

NO_KEY = "none"  # refusals before any key was recognised (missing or invalid key)


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("serving_requests_by_key", "Requests a client key made, by endpoint and key name "
                                "(workers with client keys required).", ["endpoint", "key"], registry=registry)
        self.refusals = Counter("serving_refusals", "Requests the client-key check refused, by endpoint, key name "
                                "and reason (missing_key, invalid_key, endpoint_scope, rate).",
                                ["endpoint", "key", "reason"], registry=registry)

    def observe(self, event: StatisticsEvent) -> bool:
        """Count the event; True when it was a refusal (nothing else is to be counted of it)."""
        if event.refused is not None:
            self.refusals.labels(event.endpoint, event.key or NO_KEY, event.refused).inc()
            return True
        if event.key is not None and event.shadow is None:
            self.requests.labels(event.endpoint, event.key).inc()
        return False
