"""The ``torchserve`` object of a request to a TorchServe archive's endpoint (engine torchserve),
parsed leniently like ``llm`` and ``embedding``: a bad field is dropped, never the request's event::

    "torchserve": {"batch": 4, "queue_s": 0.012, "handler_s": 0.030, "hostname": "worker-1",
                   "metrics": ["[METRICS]CustomCount.count:1|#ModelName:mnist,Level:Model|#type:COUNTER|..."]}

``batch`` is the size of the batch the request was answered in, ``queue_s`` how long it waited for
that batch to be sent, ``handler_s`` how long the handler took for the whole batch; ``metrics`` are
the lines TorchServe's metric objects wrote while the handler ran that batch (a handler's custom
metrics through ``context.metrics``), reported by the batch's first request only. Their metrics:
serving/statistics/torchserve_metrics.py.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

MAX_LINES = 256  # metric lines one event may carry
METRIC_TYPES = ("COUNTER", "GAUGE", "HISTOGRAM")
_LINE = re.compile(r"^\[METRICS\](?P<head>[^|]+)\|#(?P<dims>[^|]*)\|#type:(?P<type>[A-Z]+)")


@dataclass(frozen=True)
class HandlerMetric:
    """One value a handler added: TorchServe's name, unit, kind and dimensions."""

    name: str
    unit: str
    value: float
    kind: str
    dimensions: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TorchServeTiming:
    batch: int
    queue_s: float
    handler_s: float
    hostname: str
    metrics: tuple[HandlerMetric, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "queue_s": self.queue_s, "handler_s": self.handler_s, "hostname": self.hostname,
                "metrics": [m.name for m in self.metrics]}


def _seconds(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number >= 0 else 0.0


def parse_metric_line(line: Any) -> HandlerMetric | None:
    """``[METRICS]name.unit:value|#dim:value,...|#type:KIND|#hostname:...`` (None when it is not one)."""
    if not isinstance(line, str):
        return None
    found = _LINE.match(line)
    if found is None or found["type"] not in METRIC_TYPES:
        return None
    head, _, raw_value = found["head"].rpartition(":")
    name, _, unit = head.rpartition(".")
    try:
        value = float(raw_value)
    except ValueError:
        return None
    if not name or not math.isfinite(value):
        return None
    dims = []
    for pair in filter(None, found["dims"].split(",")):
        key, sep, dim_value = pair.partition(":")
        if sep and key:
            dims.append((key, dim_value))
    return HandlerMetric(name=name, unit=unit, value=value, kind=found["type"], dimensions=tuple(dims))


def parse_torchserve(value: Any) -> TorchServeTiming | None:
    if not isinstance(value, dict):
        return None
    batch = value.get("batch")
    lines = value.get("metrics")
    metrics = tuple(m for m in map(parse_metric_line, lines[:MAX_LINES]) if m is not None) \
        if isinstance(lines, list) else ()
    hostname = value.get("hostname")
    return TorchServeTiming(batch=batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else 1,
                            queue_s=_seconds(value.get("queue_s")), handler_s=_seconds(value.get("handler_s")),
                            hostname=hostname[:128] if isinstance(hostname, str) and hostname else "unknown",
                            metrics=metrics)
