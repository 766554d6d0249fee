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

What the loads came to is also told to the statistics service (:class:`LoadOutcomes`): each failed
attempt to load a version, each version once it takes traffic in this process, and once it no longer
does (``serving_model_load_failures_total``, ``serving_model_ready``; docs/statistics.md).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from serving.worker.runtime import EndpointRuntime, Target

log = logging.getLogger(__name__)

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


class TargetLoadError(Exception):
    """Building an endpoint failed while loading ``targets`` (the version being loaded, or all of them
    when the failing part is shared by the versions). ``stage``: ``model`` (the engine loading it) or
    ``preprocess`` (its tokenizer, user code). ``str()`` is the cause's ``Type: message``, as
    readiness reports show it."""

    def __init__(self, cause: BaseException, stage: str, targets: tuple[Target, ...]) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.stage, self.targets = stage, targets


LoadKey = tuple[str, str, int]  # endpoint, model, version


class LoadOutcomes:
    """Load outcomes as statistics events (``StatisticsRecorder.record_load``): ``failed`` for each failed
    attempt, ``ready`` when a version starts taking traffic in this process (again after it failed),
    ``retired`` when a version reported either way is neither routed nor failing here any more (it left
    the config, or its endpoint was fixed). The caller serializes the calls (the config lock);
    ``recorder()`` may be None (statistics off) or lack ``record_load`` (a test's request recorder),
    and recording never blocks."""

    def __init__(self, recorder: Callable[[], Any]) -> None:
        self.recorder = recorder
        self._failing: dict[LoadKey, str] = {}  # key -> engine, of the versions failing now
        self._reported: dict[LoadKey, tuple[str, str]] = {}  # key -> (state, engine) last reported

    def attempted(self, failures: Mapping[str, tuple[str, TargetLoadError]]) -> None:
        """After a config was applied: ``failures`` endpoint -> (engine, error) of the endpoints that
        could not be built. Versions failing here are not reported ready while they fail."""
        self._failing = {}
        for name, (engine, error) in failures.items():
            for target in error.targets:
                key = (name, target.model, target.version)
                self._failing[key] = engine
                self._reported[key] = ("failed", engine)
                self._record(key, engine, "failed", error.stage)

    def routed(self, endpoints: Mapping[str, EndpointRuntime], pending: Mapping[str, Pending]) -> None:
        """After each change of what is routed: report the versions that newly take traffic, and retire
        those that neither take traffic nor fail any more."""
        ready: dict[LoadKey, str] = {}
        for name, ep in endpoints.items():
            entry = pending.get(name)
            if entry is not None and entry.installed:  # a brand-new endpoint answering 503 until ready
                continue
            for target in ep.targets:
                key = (name, target.model, target.version)
                if key not in self._failing:
                    ready[key] = ep.engine
        for key, engine in ready.items():
            if self._reported.get(key, ("",))[0] != "ready":
                self._record(key, engine, "ready")
        for key, (_, engine) in self._reported.items():
            if key not in ready and key not in self._failing:
                self._record(key, engine, "retired")
        self._reported = {**{k: ("failed", e) for k, e in self._failing.items()},
                          **{k: ("ready", e) for k, e in ready.items()}}

    def _record(self, key: LoadKey, engine: str, state: str, reason: str | None = None) -> None:
        try:
            record = getattr(self.recorder(), "record_load", None)  # serving.statistics.StatisticsRecorder
            if record is not None:
                endpoint, model, version = key
                record(endpoint, version, model=model, engine=engine, state=state, reason=reason)
        except Exception:  # statistics must never fail a config
            log.exception("load outcome not recorded")
