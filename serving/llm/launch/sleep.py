"""Scale to zero on one machine (`serving up`'s launcher): an idle engine's processes stop, and the next
request starts them again.

Why: an LLM version used a few times a day holds its GPU memory and cores for nothing. On Kubernetes the
launcher scales the engine's Deployment to zero (serving/llm/kube/idle.py); here the same rule stops the
engine's processes. An engine whose endpoint sets ``scale_to_zero_after_s`` and whose replicas did no work
for that long (``IdleClocks``: vLLM's own metrics, never sleeping on doubt) is stopped and shown as
``scaled_to_zero``; a worker that gets a request for it holds the request and calls ``POST /engines/wake``
(serving/llm/engines/wake.py); the launcher's next tick starts the replicas again, shown as ``starting``
with ``waking`` until one is ready. The folder stays unpacked, so the cold start is vLLM's own start.

Unlike on Kubernetes, that an engine sleeps is kept only in this process: a restarted launcher starts every
engine, and each goes back to sleep once idle again. A wake only marks the engine (the HTTP thread never
forks: the tick does, see launcher.py), under a lock of its own so that it never waits for a tick.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from serving.llm.kube.idle import IdleClocks

log = logging.getLogger(__name__)


@dataclass
class _Nap:
    asleep: bool = False
    woken_at: float | None = None  # the wake call's time, until a replica is ready (the cold start's start)


class Sleep:
    """Which engines sleep, which are waking, and the cold starts measured."""

    def __init__(self, idle: IdleClocks | None = None, on_cold_start: Callable[[str, float], None] = lambda k, s: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.idle = idle or IdleClocks(clock=clock)
        self.on_cold_start = on_cold_start
        self.cold_start_s: dict[str, float] = {}
        self._naps: dict[str, _Nap] = {}
        self._lock = threading.Lock()

    def asleep(self, key: str) -> bool:
        with self._lock:
            return key in self._naps and self._naps[key].asleep

    def waking(self, key: str) -> bool:
        """Woken, and no replica ready yet."""
        with self._lock:
            return key in self._naps and self._naps[key].woken_at is not None

    def due(self, key: str, after: int | None, view: dict[str, Any]) -> bool:
        """Whether the engine (``view``: its map entry) should sleep now: it may, it is ready and not waking,
        and no replica did any work for ``after`` seconds."""
        with self._lock:
            nap = self._naps.setdefault(key, _Nap())
            if not after or nap.asleep or nap.woken_at is not None:
                return False
        self.idle.observe(key, view["replicas"])
        return view["state"] == "ready" and self.idle.idle_s(key) >= float(after)

    def slept(self, key: str) -> None:
        log.info("engine %s: idle for %.0f s, scaled to zero (its processes stopped)", key, self.idle.idle_s(key))
        with self._lock:
            self._naps[key] = _Nap(asleep=True)

    def wake(self, key: str) -> bool:
        """Mark a sleeping engine to be started (by the next tick); False when it was not asleep."""
        with self._lock:
            nap = self._naps.get(key)
            if nap is None or not nap.asleep:
                return False
            nap.asleep, nap.woken_at = False, self.clock()
        self.idle.active(key, nap.woken_at)  # a woken engine gets its whole idle period before it may sleep again
        log.info("engine %s: woken by a request", key)
        return True

    def measure(self, key: str, view: dict[str, Any]) -> None:
        """Once a woken engine has a ready replica, its cold start is known."""
        with self._lock:
            nap = self._naps.get(key)
            if nap is None or nap.woken_at is None or view["state"] != "ready":
                return
            now = self.clock()
            seconds, nap.woken_at = max(0.0, now - nap.woken_at), None
            self.cold_start_s[key] = seconds
        self.idle.active(key, now)  # its idle period starts once it can serve, not at the wake
        log.info("engine %s: awake, cold start %.1f s", key, seconds)
        self.on_cold_start(key, seconds)

    def mark(self, key: str, view: dict[str, Any], after: int | None) -> dict[str, Any]:
        """The engine's map entry as workers and the console read it."""
        with self._lock:
            nap = self._naps.get(key) or _Nap()
        if nap.asleep:
            view = {**view, "url": None, "state": "scaled_to_zero", "error": None, "replicas": []}
        elif nap.woken_at is not None and view["state"] == "starting":
            view = {**view, "waking": True}
        if after:
            view["scale_to_zero_after_s"] = after
        if key in self.cold_start_s:
            view["cold_start_s"] = round(self.cold_start_s[key], 1)
        return view

    def retain(self, keys: set[str]) -> None:
        with self._lock:
            for key in set(self._naps) - keys:
                del self._naps[key]
        self.idle.retain(keys)


def engine_states(views: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each engine's state as the readiness report carries it to the console (registry/readiness.py
    ``EngineState``), from its map entries: on one machine and on Kubernetes alike."""
    return {k: {"state": v["state"], "waking": bool(v.get("waking")),
                "replicas": len([r for r in v["replicas"] if r["state"] == "ready"]),
                "scale_to_zero_after_s": v.get("scale_to_zero_after_s"),
                "cold_start_s": v.get("cold_start_s")} for k, v in views.items()}
