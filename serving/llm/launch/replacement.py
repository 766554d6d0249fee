"""An engine replaced under the same key, without losing a request.

Why: some changes alter what an engine computes while its key stays (the first LoRA adapter of a base
turns LoRA on: ``--enable-lora`` is fixed when vLLM starts; an adapter of a higher rank needs a larger
``--max-lora-rank``). Stopping the engine first would fail the base's endpoint's requests until the new
one is up (a minute on a CPU, more for a large model). So the old engine set retires instead:

1. the new set starts beside it (new ports, the same slots; its replicas named ``KEY~N``);
2. until every new replica is ready, the launcher's map shows the old replicas, which keep serving;
3. then the map shows the new ones, and each worker moves within its map's TTL;
4. the old set is stopped once its engines have no request running or waiting (read from their own
   ``/metrics``) and ``grace_s`` has passed, or at ``drain_s`` at the latest.

Should the new set fail (a crash loop), the old one keeps serving and the failure is reported as usual.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx

from serving.llm.launch.metrics import engine_queue

# the launcher's EngineSet and Engine (serving/llm/launch/launcher.py), which imports this module
EngineSet = Any
Engine = Any

log = logging.getLogger(__name__)


@dataclass
class Retiring:
    old: EngineSet
    switched_at: float | None = None   # when the new set was first all ready (the map shows it since)


class Replacements:
    """The retiring engine sets, by key (at most one per key: a change during a replacement replaces
    the new set, not the serving one)."""

    def __init__(self, stop_replica: Callable[[Engine], None], grace_s: float, drain_s: float) -> None:
        self.stop_replica = stop_replica
        self.grace_s = grace_s
        self.drain_s = drain_s
        self.retiring: dict[str, Retiring] = {}

    def retire(self, old: EngineSet) -> bool:
        """Keep ``old`` serving while its successor starts; False when it cannot serve meanwhile (no ready
        replica) or an older set of the key already serves (then the caller stops it at once)."""
        if old.key in self.retiring or not any(r.state == "ready" for r in old.replicas):
            return False
        self.retiring[old.key] = Retiring(old)
        log.info("engine %s changed: the new one starts beside it, which serves until it is ready", old.key)
        return True

    def serving(self, new: EngineSet) -> EngineSet:
        """The set the map shows for ``new``'s key: the retiring one until ``new`` is all ready."""
        entry = self.retiring.get(new.key)
        return entry.old if entry is not None and entry.switched_at is None else new

    def tick(self, engines: dict[str, EngineSet], on_change: Callable[[], None]) -> None:
        """Switch to each new set once it is all ready; stop each old one once drained (or no longer wanted)."""
        now = time.monotonic()
        for key, entry in list(self.retiring.items()):
            new = engines.get(key)
            if new is None:  # undeployed meanwhile
                self._stop(key)
                continue
            if entry.switched_at is None:
                if new.all_ready:
                    entry.switched_at = now
                    log.info("engine %s: the new one is ready and serves; the old one stops once idle", key)
                    on_change()
                continue
            waited = now - entry.switched_at
            if waited >= self.drain_s or (waited >= self.grace_s and self._idle(entry.old)):
                self._stop(key)

    def pids(self) -> Iterator[int]:
        """The retiring engines' processes (the memory budget counts them until they stop)."""
        for entry in self.retiring.values():
            yield from (r.proc.pid for r in entry.old.replicas if r.proc is not None)

    def close(self) -> None:
        for key in list(self.retiring):
            self._stop(key)

    def _stop(self, key: str) -> None:
        entry = self.retiring.pop(key)
        for replica in entry.old.replicas:
            self.stop_replica(replica)
        log.info("stopped the replaced engine %s", key)

    @staticmethod
    def _idle(old: EngineSet) -> bool:
        """No request running or waiting on any of its replicas (one that does not answer counts as idle:
        it serves nothing)."""
        for replica in old.replicas:
            try:
                r = httpx.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=1.0)
            except httpx.HTTPError:
                continue
            if r.status_code == 200 and engine_queue(r.content) > 0:
                return False
        return True
