"""The prediction log's counts (serving/prediction_log/writer.py): records each worker process wrote to
its sink and records it dropped (its queue full while the sink was down or slow), by endpoint.

A worker reports increases, in events of their own (``prediction_log: {"written", "dropped"}``), never
mixed with a request's: they count no request. ``serving_prediction_log_records_total{outcome="dropped"}``
is what a sink outage cost; with the written count, what share of the sampled requests the log holds.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from serving.statistics.events import StatisticsEvent


class PredictionLogMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter("serving_prediction_log_records",
                               "Prediction-log records worker processes wrote to the sink (outcome=written) or "
                               "dropped past their queue's bound (outcome=dropped).",
                               ["endpoint", "outcome"], registry=registry)

    def observe(self, event: StatisticsEvent) -> bool:
        """Count the event; True when it was a prediction-log report (nothing else is to be counted of it)."""
        counts = event.prediction_log
        if counts is None:
            return False
        if counts.written:
            self.records.labels(event.endpoint, "written").inc(counts.written)
        if counts.dropped:
            self.records.labels(event.endpoint, "dropped").inc(counts.dropped)
        return True
