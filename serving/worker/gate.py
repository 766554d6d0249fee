"""Readiness gating: a model version gets traffic only once its engine can answer for it.

When a config changes an endpoint's targets (a replacing deploy, promote, rollback, a new
auto-update version, a rollout step, a shadow), the worker builds the new definition at
once but keeps routing to the previous one until every new target is ready where it runs
(Triton has loaded the model, the onnxruntime session is open). Then the endpoint alone is
swapped, atomically, in a new :class:`Config`. A brand-new endpoint has nothing to fall back
on, so it is installed at once and answers 503 with ``Retry-After`` until it is ready.

Readiness is asked only of targets not known ready yet, so a config that changes one
endpoint of 150 costs one check, and the push stays a few milliseconds; a brand-new endpoint's
targets (all of them at a worker's start) are checked by the background thread, never on the
config's path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from serving.worker.runtime import EndpointRuntime, Target

FAST_RECHECK_S = 0.05  # while a switch is young: how soon a ready model takes traffic
SLOW_RECHECK_S = 1.0   # after SLOW_AFTER_S: a model that is slow to load (or will never load)
SLOW_AFTER_S = 10.0


@dataclass
class Pending:
    """An endpoint definition waiting for its targets; ``installed``: a brand-new endpoint already
    answering (503 until ready), so there is nothing to swap, only a state to report."""

    runtime: EndpointRuntime
    revision: int
    installed: bool = False
    since: float = field(default_factory=time.monotonic)
    waiting: tuple[str, ...] = ()

    def age_s(self) -> float:
        return time.monotonic() - self.since

    def recheck_s(self) -> float:
        return FAST_RECHECK_S if self.age_s() < SLOW_AFTER_S else SLOW_RECHECK_S


def _key(engine: str, target: Target) -> tuple[str, str, str, int]:
    return engine, target.triton_name, target.artifact, target.version


class ReadinessGate:
    """Which targets are ready on their engine; remembers the ones that were, while they are used."""

    def __init__(self, engines: Mapping[str, Any]) -> None:
        self.engines = engines
        self._known: set[tuple[str, str, str, int]] = set()

    def unready(self, ep: EndpointRuntime) -> tuple[Target, ...]:
        """The endpoint's targets its engine cannot answer for yet (checked now, off the event loop).
        An engine without ``is_ready`` is ready once ``prepare`` returned (it loads in-process)."""
        check = getattr(self.engines.get(ep.engine), "is_ready", None)
        waiting = []
        for target in ep.targets:
            key = _key(ep.engine, target)
            if key in self._known:
                continue
            if check is None or check(target):
                self._known.add(key)
            else:
                waiting.append(target)
        return tuple(waiting)

    def unknown(self, ep: EndpointRuntime) -> tuple[Target, ...]:
        """The targets not known ready, without asking the engine (no call on the config's path)."""
        if getattr(self.engines.get(ep.engine), "is_ready", None) is None:
            return ()
        return tuple(t for t in ep.targets if _key(ep.engine, t) not in self._known)

    def retain(self, endpoints: Iterable[EndpointRuntime]) -> None:
        """Forget what left the config: a version removed and added back must be checked again
        (its engine may have unloaded it meanwhile)."""
        used = {_key(ep.engine, t) for ep in endpoints for t in ep.targets}
        self._known &= used


def label(target: Target) -> str:
    return target.triton_name or f"{target.model}:{target.version}"


def decide(gate: ReadinessGate, built: Mapping[str, EndpointRuntime], previous: Mapping[str, EndpointRuntime],
           revision: int) -> tuple[dict[str, EndpointRuntime], dict[str, Pending]]:
    """The endpoints to route to now, and those waiting for readiness."""
    active: dict[str, EndpointRuntime] = {}
    pending: dict[str, Pending] = {}
    for name, ep in built.items():
        old = previous.get(name)
        if old is None:  # nothing to fall back on: routed now; the gate thread asks the engine later
            active[name] = ep
            unknown = gate.unknown(ep)
            if unknown:
                pending[name] = Pending(ep, revision, installed=True, waiting=tuple(label(t) for t in unknown))
            continue
        waiting = gate.unready(ep)
        if waiting:
            active[name] = old
            pending[name] = Pending(ep, revision, waiting=tuple(label(t) for t in waiting))
        else:
            active[name] = ep
    return active, pending


def endpoint_state(ep: EndpointRuntime | None, pending: Pending | None, error: str | None) -> dict[str, Any]:
    """One endpoint's line of the readiness report (docs/architecture.md)."""
    entry: dict[str, Any] = {"state": "ready", "error": None,
                             "serving": [[t.version, t.weight, t.role] for t in ep.targets] if ep else []}
    if pending is not None:
        entry.update(state="pending", waiting=list(pending.waiting), pending_s=round(pending.age_s(), 1))
    if error is not None:
        entry.update(state="failed", error=error)
    return entry
