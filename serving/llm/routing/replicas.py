"""The replicas of one engine, as one worker process sees them: which may take a request, how loaded
each is, and which failed.

- **Members** come from the launcher's ``/engines`` (its replicas of a version, each ``starting``,
  ``ready`` or ``failed``) or from an external engine's URLs (external.py). Only a ready member that
  is not taken out gets a new request: a replica still starting (or restarting) gets none.
- **Load**: this process counts its own requests on each member; while the set is used, each ready
  member's ``/metrics`` is read every ``METRICS_PERIOD_S`` for vLLM's ``num_requests_running`` and
  ``num_requests_waiting`` (every worker's requests), which :attr:`Replica.load` combines.
- **Failure**: a member whose connection failed before any byte of an answer is taken out (the
  request goes to the next in the policy's order, serving/llm/engines/vllm.py) and asked
  ``/health`` every ``PROBE_PERIOD_S`` until it answers; then it is back. Should every member be
  taken out, they are all tried anyway (one may be back before its probe says so).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable, NamedTuple

import aiohttp

from serving.llm.launch.metrics import engine_queue
from serving.llm.routing import policies as replica_policies
from serving.llm.routing.policies.base import Policy, Replica, RouteHint

log = logging.getLogger(__name__)

METRICS_PERIOD_S = 1.0
PROBE_PERIOD_S = 0.5
IDLE_S = 30.0   # no request for this long: stop reading the members' metrics


class Member(NamedTuple):
    id: str
    url: str
    ready: bool = True
    adapters: frozenset[str] = frozenset()


def root(url: str) -> str:
    """The server's root from an OpenAI base URL (``.../v1``)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class ReplicaSet:
    def __init__(self, name: str, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.name = name
        self.session = session
        self.members: dict[str, Replica] = {}
        self.policies: dict[str, Policy] = {}
        self.failovers = 0          # requests sent again to another member after theirs failed
        self._used_at = float("-inf")
        self._task: asyncio.Task | None = None

    # --- membership -----------------------------------------------------------------
    def update(self, members: Iterable[Member]) -> None:
        fresh: dict[str, Replica] = {}
        for m in members:
            known = self.members.get(m.id)
            if known is None or known.url != m.url:  # new, or restarted elsewhere: what we knew is stale
                known = Replica(m.id, m.url)
                if m.id in self.members:
                    log.info("%s replica %s now at %s", self.name, m.id, m.url)
            known.ready, known.adapters = m.ready, m.adapters
            fresh[m.id] = known
        self.members = fresh

    def candidates(self, adapter: str | None = None) -> list[Replica]:
        """Ready members (those holding ``adapter``, when named) not taken out; all ready ones if every
        one is taken out."""
        live = [r for r in self.members.values() if r.ready and (adapter is None or adapter in r.adapters)]
        return [r for r in live if not r.down] or live

    def order(self, policy: str | None, hint: RouteHint, adapter: str | None = None) -> list[Replica]:
        """The candidates in the order to try them, as the endpoint's policy ranks them."""
        self._used_at = time.monotonic()
        self._start()
        candidates = self.candidates(adapter)
        if len(candidates) < 2:
            return candidates
        name = policy or replica_policies.DEFAULT
        if name not in self.policies:
            self.policies[name] = replica_policies.create(name)
        return self.policies[name].order(candidates, hint)

    def take_out(self, replica: Replica, why: Exception) -> None:
        if not replica.down:
            log.warning("%s replica %s (%s) taken out: %s: %s", self.name, replica.id, replica.url,
                        type(why).__name__, why)
        replica.down = True

    # --- upkeep: the engines' queues, the members taken out ---------------------------------
    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._upkeep())

    async def _upkeep(self) -> None:
        last_read = float("-inf")
        while True:
            try:
                now = time.monotonic()
                if now - self._used_at < IDLE_S and now - last_read >= METRICS_PERIOD_S and len(self.members) > 1:
                    last_read = now
                    await asyncio.gather(*(self._read_queue(r) for r in list(self.members.values())
                                           if r.ready and not r.down))
                await asyncio.gather(*(self._probe(r) for r in list(self.members.values()) if r.down))
            except Exception:  # upkeep must outlive any one failure
                log.exception("upkeep of %s failed", self.name)
            await asyncio.sleep(min(PROBE_PERIOD_S, METRICS_PERIOD_S))

    async def _read_queue(self, replica: Replica) -> None:
        at = replica.in_flight
        try:
            async with self.session().get(f"{root(replica.url)}/metrics",
                                          timeout=aiohttp.ClientTimeout(total=METRICS_PERIOD_S)) as r:
                if r.status != 200:
                    return
                queue = engine_queue(await r.read())
        except (aiohttp.ClientError, asyncio.TimeoutError):
            replica.engine_queue = None  # unknown: its own count only, until it answers again
            return
        replica.engine_queue, replica.in_flight_at_read = queue, at

    async def _probe(self, replica: Replica) -> None:
        try:
            async with self.session().get(f"{root(replica.url)}/health",
                                          timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                healthy = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            healthy = False
        if healthy and replica.down:
            replica.down = False
            log.info("%s replica %s (%s) answers again", self.name, replica.id, replica.url)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
