"""Ground truth joined to what was predicted, and each version's live quality from it.

Why here: the statistics service already receives every request's event, and the events of requests the
prediction log keeps carry their ``request_id`` and ``prediction`` (the answer's label, or its value for
a regression; serving/worker/prediction_capture.py). The service remembers those (a bounded map, oldest
forgotten first: ``SERVING_FEEDBACK_MAX_REQUESTS``), and a worker's ``POST /feedback`` joins the true
label or value to them at once: an unknown request id is refused there, in the front end's own shape,
rather than lost later.

Per endpoint and version, to Prometheus:

- ``serving_feedback_labelled_total``, ``serving_feedback_correct_total`` (labels),
  ``serving_feedback_abs_error_sum_total`` (values): cumulative, for PromQL windows of any length;
- ``serving_live_accuracy``, ``serving_live_mae`` and ``serving_live_labelled``: over the last
  ``SERVING_FEEDBACK_WINDOW_S`` seconds of feedback (by when it arrived), what the console and the
  accuracy rollout gate read.

A request is labelled once: a second label for it is a 409 (the first one counted). Labels compare as
text, so ``1`` and ``"1"`` are the same class; values as numbers.
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from serving.statistics.metrics import version_label

MAX_REQUESTS = 1_000_000
WINDOW_S = 3600.0


class FeedbackError(ValueError):
    status = 400


class UnknownRequest(FeedbackError):
    status = 404


class AlreadyLabelled(FeedbackError):
    status = 409


@dataclass
class Predicted:
    endpoint: str
    version: str
    label: str | None = None
    value: float | None = None
    labelled: bool = False


@dataclass(frozen=True)
class Joined:
    request_id: str
    endpoint: str
    version: str
    prediction: Any
    correct: bool | None = None
    abs_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"request_id": self.request_id, "endpoint": self.endpoint, "version": self.version,
               "prediction": self.prediction}
        if self.correct is not None:
            out["correct"] = self.correct
        if self.abs_error is not None:
            out["abs_error"] = self.abs_error
        return out


def prediction_of(raw: Any) -> tuple[str | None, float | None] | None:
    """An event's ``prediction``: ``{"label": ...}`` or ``{"value": number}``; None if it has neither."""
    if not isinstance(raw, dict):
        return None
    if raw.get("label") is not None and isinstance(raw["label"], (str, int, bool)):
        return str(raw["label"])[:256], None
    value = raw.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return None, float(value)
    return None


class GroundTruth:
    def __init__(self, registry: CollectorRegistry, max_requests: int = MAX_REQUESTS, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_requests, self.window_s, self.clock = max_requests, window_s, clock
        self._requests: OrderedDict[str, Predicted] = OrderedDict()
        self._recent: dict[tuple[str, str], deque[tuple[float, bool | None, float | None]]] = {}
        self._lock = threading.Lock()
        labels = ["endpoint", "version"]
        self.labelled = Counter("serving_feedback_labelled", "Requests given their ground truth (POST feedback).",
                                labels, registry=registry)
        self.correct = Counter("serving_feedback_correct", "Labelled requests whose predicted label was the true one.",
                               labels, registry=registry)
        self.abs_error = Counter("serving_feedback_abs_error_sum", "Sum of |predicted - true| of requests given a "
                                 "true value (regressions).", labels, registry=registry)
        registry.register(_LiveQuality(self))

    # --- predictions, from the events ------------------------------------------------
    def remember(self, request_id: str, endpoint: str, version: int | None, prediction: Any) -> None:
        parsed = prediction_of(prediction)
        if parsed is None or not request_id:
            return
        with self._lock:
            self._requests[request_id] = Predicted(endpoint, version_label(version), *parsed)
            self._requests.move_to_end(request_id)
            while len(self._requests) > self.max_requests:
                self._requests.popitem(last=False)

    # --- ground truth, from POST /feedback ----------------------------------------------
    def join(self, endpoint: str, request_id: str, label: Any = None, value: Any = None) -> Joined:
        if (label is None) == (value is None):
            raise FeedbackError("feedback needs exactly one of 'label' (a class) or 'value' (a number)")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise FeedbackError(f"'value' must be a finite number, not {value!r}")
        with self._lock:
            known = self._requests.get(request_id)
            if known is None or known.endpoint != endpoint:
                raise UnknownRequest(f"no logged request {request_id!r} of endpoint {endpoint!r}: feedback joins "
                                     "requests the prediction log kept (serving endpoint log), while the statistics "
                                     f"service remembers them (the last {self.max_requests:,})")
            if known.labelled:
                raise AlreadyLabelled(f"request {request_id!r} already has its feedback")
            joined = self._score(request_id, known, label, value)  # a label of the wrong kind labels nothing
            known.labelled = True
            self._recent.setdefault((known.endpoint, known.version), deque()).append(
                (self.clock(), joined.correct, joined.abs_error))
        labels = (known.endpoint, known.version)
        self.labelled.labels(*labels).inc()
        if joined.correct:
            self.correct.labels(*labels).inc()
        if joined.abs_error is not None:
            self.abs_error.labels(*labels).inc(joined.abs_error)
        return joined

    @staticmethod
    def _score(request_id: str, known: Predicted, label: Any, value: Any) -> Joined:
        if label is not None:
            if known.label is None:
                raise FeedbackError(f"request {request_id!r} predicted a value ({known.value}); send 'value'")
            return Joined(request_id, known.endpoint, known.version, known.label, correct=str(label) == known.label)
        if known.value is None:
            raise FeedbackError(f"request {request_id!r} predicted a label ({known.label!r}); send 'label'")
        return Joined(request_id, known.endpoint, known.version, known.value, abs_error=abs(float(value) - known.value))

    # --- the live window ----------------------------------------------------------------
    def window(self) -> Iterator[tuple[tuple[str, str], int, float | None, float | None]]:
        """(endpoint, version), labelled, accuracy, MAE over the last ``window_s`` seconds."""
        horizon = self.clock() - self.window_s
        with self._lock:
            for key, items in self._recent.items():
                while items and items[0][0] < horizon:
                    items.popleft()
                labels = [c for _, c, _ in items if c is not None]
                errors = [e for _, _, e in items if e is not None]
                yield (key, len(items), sum(labels) / len(labels) if labels else None,
                       sum(errors) / len(errors) if errors else None)


class _LiveQuality:
    """The window's figures, computed at each scrape."""

    def __init__(self, truth: GroundTruth) -> None:
        self.truth = truth

    def collect(self):
        n = GaugeMetricFamily("serving_live_labelled", "Requests given their ground truth over the live window.",
                              labels=["endpoint", "version"])
        acc = GaugeMetricFamily("serving_live_accuracy", "Share of labelled requests predicted right, over the "
                                "live window (SERVING_FEEDBACK_WINDOW_S).", labels=["endpoint", "version"])
        mae = GaugeMetricFamily("serving_live_mae", "Mean absolute error of requests given a true value, over the "
                                "live window.", labels=["endpoint", "version"])
        for key, labelled, accuracy, error in self.truth.window():
            n.add_metric(list(key), labelled)
            if accuracy is not None:
                acc.add_metric(list(key), accuracy)
            if error is not None:
                mae.add_metric(list(key), error)
        yield from (n, acc, mae)
