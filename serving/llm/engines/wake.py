"""Requests for an LLM engine scaled to zero are held until it is ready again, as Knative's activator does.

Why: the launcher scales an engine idle for long to zero replicas (its processes on one machine,
serving/llm/launch/sleep.py; its pods on Kubernetes, serving/llm/kube/engines.py) and reports
it ``scaled_to_zero``; only a request can tell that it is wanted again. Answering that request 503 would
lose it, and nothing else would wake the engine. So the worker holds it: it asks the launcher to wake the
engine (``POST /engines/wake``, idempotent there), reads the launcher's map again until the engine is
``ready``, and the request then goes on to the ready replicas as any other.

Per engine and worker process there is one :class:`_Hold`: one task that sends the wake call (at most one in
flight, sent again every ``WAKE_AGAIN_S`` while the map still says ``scaled_to_zero``) and reads the map every
``POLL_S`` for all the requests held, which only wait for its end. An engine being woken (``starting`` with
``waking``, perhaps by another worker) is held for too; a first start (plain ``starting``) is not: that
stays a 503 with Retry-After, as a version not yet deployed is. Held requests are bounded in number
(``SERVING_LLM_HOLD_MAX``: more are refused at once) and in time (``SERVING_LLM_HOLD_S``), both a 503 with
Retry-After; a client that goes away frees its place at once (its task is cancelled).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp
import orjson

from serving.llm.engines.hold_metrics import HOLD_STATS
from serving.worker.errors import Unavailable, brief

log = logging.getLogger(__name__)

POLL_S = 0.5          # the map is read this often while requests are held
WAKE_AGAIN_S = 5.0    # a wake call is sent again after this while the engine still sleeps
WAKE_TIMEOUT_S = 5.0
RETRY_AFTER_S = 2


def asleep(entry: dict[str, Any] | None) -> bool:
    """Scaled to zero, or being woken from it: a request for it is held (and the version stays routable)."""
    if not entry:
        return False
    state = entry.get("state")
    return state == "scaled_to_zero" or (state == "starting" and bool(entry.get("waking")))


def _coming(entry: dict[str, Any] | None) -> bool:
    """Still on its way up, once a request is held for it (the ``waking`` mark may go before ``ready``)."""
    return bool(entry) and entry.get("state") in ("scaled_to_zero", "starting")


@dataclass(frozen=True)
class HoldLimits:
    """How many requests one worker process holds per engine, and for how long (WorkerSettings)."""

    max_held: int = 64
    hold_s: float = 180.0


@dataclass(eq=False)
class _Hold:
    """The requests held for one engine, and the one task that reads the map for them all."""

    key: str
    waiting: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    entry: dict[str, Any] | None = None  # the engine's entry when it left its sleep (ready, failed, gone)
    poller: asyncio.Task | None = None


class Holds:
    """One per LLM engine client (one per worker process)."""

    def __init__(self, launcher_url: str, session: Callable[[], aiohttp.ClientSession],
                 read_map: Callable[[], Awaitable[dict[str, Any]]], limits: HoldLimits) -> None:
        self.launcher_url = launcher_url.rstrip("/")
        self._session, self._read_map, self.limits = session, read_map, limits
        self._holds: dict[str, _Hold] = {}
        self._wakes: dict[str, asyncio.Task] = {}     # the wake call in flight, per engine key
        self._woken_at: dict[str, float] = {}         # when the last one was sent (monotonic)

    def held(self, key: str) -> int:
        hold = self._holds.get(key)
        return hold.waiting if hold else 0

    async def wait(self, key: str, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Hold this request until engine ``key`` (``entry``: asleep, freshly read) is up, and return its
        entry then: ``ready``, or ``failed`` or None (removed) for the caller to refuse as it does any
        engine's. A 503 (:class:`Unavailable`) when ``max_held`` wait already, or past ``hold_s``."""
        hold = self._holds.get(key)
        if hold is not None and hold.waiting >= self.limits.max_held:
            HOLD_STATS.outcome(key, "refused_full")
            raise Unavailable(f"the LLM engine of model {key} is starting from zero; {hold.waiting} requests are "
                              "already waiting", retry_after_s=RETRY_AFTER_S)
        if hold is None:
            hold = self._holds[key] = _Hold(key)
            hold.poller = asyncio.create_task(self._poll(hold, entry), name=f"llm-wake-{key}")
        hold.waiting += 1
        HOLD_STATS.begin(key)
        started, outcome = time.monotonic(), "cancelled"
        try:
            async with asyncio.timeout(self.limits.hold_s):
                await hold.done.wait()
            ready = bool(hold.entry) and hold.entry.get("state") == "ready"  # type: ignore[union-attr]
            outcome = "answered" if ready else "failed"
            return hold.entry
        except TimeoutError:
            outcome = "timed_out"
            raise Unavailable(f"the LLM engine of model {key} is starting from zero and did not become ready "
                              f"within {self.limits.hold_s:g} s", retry_after_s=RETRY_AFTER_S) from None
        finally:
            hold.waiting -= 1
            HOLD_STATS.end(key)
            HOLD_STATS.outcome(key, outcome, time.monotonic() - started if outcome == "answered" else None)
            if hold.waiting == 0 and not hold.done.is_set():  # nobody waits: stop reading the map for it
                self._drop(hold)

    async def close(self) -> None:
        for hold in list(self._holds.values()):
            self._drop(hold)
            hold.done.set()  # entry None: its requests end as for an engine removed
        for task in list(self._wakes.values()):
            task.cancel()

    def _drop(self, hold: _Hold) -> None:
        if hold.poller is not None:
            hold.poller.cancel()
        if self._holds.get(hold.key) is hold:
            del self._holds[hold.key]

    async def _poll(self, hold: _Hold, entry: dict[str, Any] | None) -> None:
        """Wake the engine and read the map until it is up; then let its requests go."""
        try:
            while _coming(entry):
                self._wake(hold.key, entry)  # type: ignore[arg-type]
                await asyncio.sleep(POLL_S)
                try:
                    entry = (await self._read_map()).get(hold.key)
                except Unavailable as exc:  # the launcher does not answer: hold on, within hold_s
                    log.warning("held requests for %s: %s", hold.key, exc)
        except Exception:  # a map it cannot read: its requests are refused now, not after hold_s
            log.exception("reading the LLM launcher's map for the requests held for %s failed", hold.key)
            entry = None
        hold.entry = entry
        if self._holds.get(hold.key) is hold:
            del self._holds[hold.key]
        hold.done.set()

    def _wake(self, key: str, entry: dict[str, Any]) -> None:
        """Send the wake call unless one is in flight, one went within WAKE_AGAIN_S, or the launcher
        already reports the engine being woken."""
        if entry.get("state") != "scaled_to_zero" or key in self._wakes:
            return
        sent = self._woken_at.get(key)
        if sent is not None and time.monotonic() - sent < WAKE_AGAIN_S:
            return
        self._woken_at[key] = time.monotonic()
        task = asyncio.create_task(self._send_wake(key), name=f"llm-wake-call-{key}")
        self._wakes[key] = task
        task.add_done_callback(lambda done: self._wakes.pop(key, None) if self._wakes.get(key) is done else None)

    async def _send_wake(self, key: str) -> None:
        log.info("LLM engine %s is scaled to zero: waking it for the requests held", key)
        try:
            async with self._session().post(f"{self.launcher_url}/engines/wake", data=orjson.dumps({"engine": key}),
                                            timeout=aiohttp.ClientTimeout(total=WAKE_TIMEOUT_S)) as r:
                if r.status != 202:
                    log.warning("the LLM launcher did not wake %s: HTTP %s %s", key, r.status,
                                brief(await r.text()))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # sent again while the engine sleeps
            log.warning("the LLM launcher at %s did not take the wake call for %s (%s)", self.launcher_url, key,
                        type(exc).__name__)
