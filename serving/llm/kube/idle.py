"""Scale to zero on Kubernetes: when an engine has been idle long enough to sleep, and how long it took to wake.

Why here: the launcher already reads every engine's pods each tick, and a pod's own vLLM metrics say
whether it works (requests running or waiting, or more requests finished than at the last look). An
engine whose endpoint sets ``scale_to_zero_after_s`` and whose pods have all been idle that long goes
to zero replicas (engines.py); a worker that gets a request for it holds the request and wakes it
(serving/llm/engines/wake.py, ``POST /engines/wake``). Nothing is kept only here: that an engine sleeps
is an annotation on its Deployment (a restarted or newly elected launcher reads it back), and an engine
first seen by this process counts as active now, so a restart never puts a busy engine to sleep.

The cold start is measured from the wake call (the waking launcher's clock, written on the Deployment)
to the first pod's Ready condition (the API server's clock, one-second resolution): what the first held
request waited, less the worker's own share.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import httpx

from serving.llm.launch.metrics import engine_queue

log = logging.getLogger(__name__)

ASLEEP_ANNOTATION = "serving.io/scaled-to-zero-at"
WOKEN_ANNOTATION = "serving.io/woken-at"  # Unix time of the last wake call
MEASURED_WITHIN_S = 3600.0
SCRAPE_TIMEOUT_S = 2.0
_FINISHED_LINE = re.compile(rb"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.eE+-]+)", re.M)


def finished(metrics: bytes) -> float:
    """Requests the engine finished, summed over vLLM's labels (finish reason, engine index)."""
    return sum(float(m) for m in _FINISHED_LINE.findall(metrics))


def scrape(url: str) -> bytes | None:
    """A pod's vLLM metrics (``url``: its OpenAI base, ``http://IP:PORT/v1``); None when it does not answer."""
    try:
        r = httpx.get(url.removesuffix("/").removesuffix("/v1") + "/metrics", timeout=SCRAPE_TIMEOUT_S)
        r.raise_for_status()
        return r.content
    except httpx.HTTPError:
        return None


@dataclass
class _Clock:
    active_at: float
    finished: dict[str, float] = field(default_factory=dict)  # per pod: its count at the last look


class IdleClocks:
    """Per engine: when it was last seen working."""

    def __init__(self, read: Callable[[str], bytes | None] = scrape, clock: Callable[[], float] = time.time) -> None:
        self.read, self.clock = read, clock
        self._engines: dict[str, _Clock] = {}

    def observe(self, key: str, pods: list[dict[str, Any]]) -> None:
        """Look at the engine's ready pods (``GET /engines``' replicas). It is active when it has none ready
        yet (starting is not idling), or a pod has a request in its queue, finished one since the last look,
        is seen for the first time, or does not answer (it may be busy): never sleep on doubt."""
        now = self.clock()
        c = self._engines.setdefault(key, _Clock(now))
        ready = [p for p in pods if p.get("state") == "ready" and p.get("url")]
        if not ready:
            c.active_at, c.finished = now, {}
            return
        seen: dict[str, float] = {}
        for pod in ready:
            text = self.read(pod["url"])
            if text is None:
                c.active_at = now
                continue
            seen[pod["id"]] = done = finished(text)
            if engine_queue(text) > 0 or c.finished.get(pod["id"]) != done:
                c.active_at = now
        c.finished = seen

    def active(self, key: str, at: float) -> None:
        """Count it active at ``at`` (Unix time) unless seen active later: a woken engine gets its whole idle
        period before it may sleep again, whoever woke it."""
        c = self._engines.setdefault(key, _Clock(at))
        c.active_at = max(c.active_at, at)

    def idle_s(self, key: str) -> float:
        c = self._engines.get(key)
        return 0.0 if c is None else self.clock() - c.active_at

    def retain(self, keys: set[str]) -> None:
        for key in set(self._engines) - keys:
            del self._engines[key]


class ColdStarts:
    """Cold starts, measured from the wake time a Deployment carries (``WOKEN_ANNOTATION``, set by
    whichever launcher woke it) to its first pod's Ready: any launcher reading it measures the same."""

    def __init__(self, on_measured: Callable[[str, float], None] = lambda key, s: None) -> None:
        self.on_measured = on_measured
        self.measured: dict[str, float] = {}  # engine key -> the wake time already measured
        self.last: dict[str, float] = {}      # engine key -> its last cold start, s

    def waking(self, key: str, woken_at: float | None, pods: list[dict[str, Any]]) -> bool:
        """Whether the engine is still waking; measures the cold start once a pod is Ready after the wake."""
        if woken_at is None or self.measured.get(key) == woken_at:
            return False
        ready_at = [t for t in (ready_since(p) for p in pods) if t is not None and t >= woken_at - 1]
        if not ready_at:
            return True
        self.measured[key] = woken_at
        if time.time() - woken_at < MEASURED_WITHIN_S:  # not a wake of long ago read by a restarted launcher
            seconds = self.last[key] = max(0.0, min(ready_at) - woken_at)
            log.info("engine %s: awake, cold start %.1f s", key, seconds)
            self.on_measured(key, seconds)
        return False


def ready_since(pod: dict[str, Any]) -> float | None:
    """The Unix time of the pod's Ready condition, when it is Ready."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True" and c.get("lastTransitionTime"):
            at = datetime.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
            return at.replace(tzinfo=timezone.utc).timestamp()
    return None
