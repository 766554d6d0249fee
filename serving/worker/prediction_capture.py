"""The data plane's side of the prediction log (serving/prediction_log/): which requests it keeps, and
their records once they end.

A request is chosen when its life starts (``start``): the endpoint's policy and its request id decide,
so the path knows whether to keep its inputs and outputs (the LLM relay then accumulates a stream's
text). Its record is built when its life ends (``finish``), whatever the status: failed requests are
logged with the error the client was told. A shadow copy's answer is logged beside the live record,
with the same request id and ``shadow: true`` (``shadow``), under the same sampling decision.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from serving.prediction_log.record import Captured, build
from serving.prediction_log.writer import PredictionLog
from serving.tracing import spans
from serving.worker import request_ids
from serving.worker.lifecycle import RequestStats
from serving.worker.runtime import Config, EndpointRuntime, Target

log = logging.getLogger(__name__)


class ConfigSource(Protocol):
    current: Config


class PredictionCapture:
    def __init__(self, config: ConfigSource) -> None:
        self.config = config
        self.log: PredictionLog | None = None  # set by the worker's app when a sink is configured

    def start(self, endpoint: str, request_id: str | None) -> Captured | None:
        if self.log is None:
            return None
        ep = self.config.current.endpoints.get(endpoint)
        policy = ep.prediction_log if ep is not None else None
        return Captured(policy) if policy is not None and policy.keeps(request_id) else None

    def finish(self, stats: RequestStats, status: int) -> None:
        if stats.captured is None or self.log is None:
            return
        try:
            self.log.offer(build(stats.captured, request_id=stats.request_id, endpoint=stats.endpoint,
                                 version=stats.version, status=status, latency_s=time.perf_counter() - stats.t0,
                                 error=stats.error, client=stats.client, ts=time.time(), trace_id=spans.trace_id()))
        except Exception:  # never the request's problem
            log.exception("prediction log: building the record of %s", stats.request_id)

    def shadow(self, ep: EndpointRuntime, target: Target, request: Any, answer: Any, status: int,
               latency_s: float, error: str | None = None, usage: dict | None = None) -> None:
        """A shadow copy's record (called from its background task, where the request id still is)."""
        request_id = request_ids.current()
        captured = self.start(ep.name, request_id)
        if captured is None:
            return
        captured.inputs, captured.outputs, captured.usage = request, answer, usage
        try:
            self.log.offer(build(captured, request_id=request_id, endpoint=ep.name, version=target.version,  # type: ignore[union-attr]
                                 status=status, latency_s=latency_s, error=error, shadow=True,
                                 trace_id=spans.trace_id()))
        except Exception:
            log.exception("prediction log: building the shadow record of %s", request_id)
