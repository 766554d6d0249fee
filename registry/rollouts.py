"""Progressive rollouts gated on live metrics: the control plane moves a candidate version's share
step by step and rolls it back by itself when a gate fails.

Each step lasts ``interval_s``. At its end the candidate's window (requests, error rate, p99
latency, drift, from ``rollout_metrics``) is checked against the gates: all pass -> the next
step (after the last, 100%, the candidate is promoted); one fails -> the stable version takes
all traffic again and the reason is recorded. Too little traffic to judge holds the step.

A rollout can be paused (``pause``): it keeps the share of its current step and takes no step
and makes no decision (no gate is judged) until it is resumed, with a fresh window of a whole
interval; aborting works on a paused rollout too.

The state lives in the ``rollouts`` table, so a restarted control plane resumes a rollout at
its step with a fresh window (a paused one stays paused). Of several control planes on one database
only the leader's controller ticks (registry/leadership.py); one that becomes leader resumes every
running rollout with a fresh window, as after a restart: the window's baseline is kept per process.
Should two act at once anyway (a leader that has not yet seen it lost its lock), they do not both
act on a step: each change is conditional on the step it read (``UPDATE ... WHERE step_index = ?``).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from registry import schemas
from registry.orm import AuditEntry, Endpoint, Rollout
from registry.rollout_metrics import Counters, MetricsSource, Quality, Window
from registry.service import Conflict, NotFound, Registry

log = logging.getLogger(__name__)
ACTOR = "rollout-controller"
LIVE = ("running", "paused")  # states of a rollout that is not over


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _aware(t: datetime | None) -> datetime | None:
    return t if t is None or t.tzinfo else t.replace(tzinfo=timezone.utc)  # SQLite drops the zone


# LLM endpoints' gates (ms): gate key, Window field, words. A window without the figure (no stream
# reached the candidate yet: no inter-token gap) is not judged on it, as p99 latency without requests.
LLM_GATES = (("max_ttft_p99_ms", "ttft_p99_s", "time to first token"),
             ("max_itl_p99_ms", "itl_p99_s", "inter-token latency"))


def gate_failure(window: Window, gates: dict[str, Any]) -> str | None:
    """Why the window fails a gate, or None when it passes them all."""
    n = int(window.requests)
    if gates.get("max_error_rate") is not None and window.error_rate > gates["max_error_rate"]:
        return (f"error rate {window.error_rate:.1%} > {gates['max_error_rate']:.1%} "
                f"({int(window.errors)} of {n} requests were not 2xx)")
    if gates.get("max_p99_ms") is not None and window.p99_s is not None and window.p99_s * 1000 > gates["max_p99_ms"]:
        return f"p99 latency {window.p99_s * 1000:.0f} ms > {gates['max_p99_ms']:g} ms over {n} requests"
    if gates.get("max_drift") is not None and window.drift is not None and window.drift > gates["max_drift"]:
        return f"drift (PSI) {window.drift:.3f} > {gates['max_drift']:g}"
    for gate, name, words in LLM_GATES:
        limit, value = gates.get(gate), getattr(window, name)
        if limit is not None and value is not None and value * 1000 > limit:
            return f"{words} p99 {value * 1000:.0f} ms > {limit:g} ms over {n} requests"
    return None


def accuracy_verdict(candidate: Quality, stable: Quality, gates: dict[str, Any]) -> tuple[str | None, str | None]:
    """The accuracy gate: (why to hold, why to roll back); (None, None) passes it. Both versions need
    ``min_labelled`` labelled requests in the live window before they are compared: ground truth comes
    late, and a few labels say little."""
    drop, needed = gates.get("max_accuracy_drop"), int(gates.get("min_labelled", 1))
    if drop is None:
        return None, None
    if candidate.labelled < needed or stable.labelled < needed or None in (candidate.accuracy, stable.accuracy):
        return (f"holding: {int(candidate.labelled)} labelled request(s) of the candidate and {int(stable.labelled)} "
                f"of the stable version, {needed} each needed to judge accuracy"), None
    assert candidate.accuracy is not None and stable.accuracy is not None
    if stable.accuracy - candidate.accuracy > drop:
        return None, (f"live accuracy {candidate.accuracy:.1%} < the stable version's {stable.accuracy:.1%} less "
                      f"{drop:.1%} (over {int(candidate.labelled)} and {int(stable.labelled)} labelled requests)")
    return None, None


def rollout_out(r: Rollout) -> dict[str, Any]:
    return {"id": r.id, "endpoint": r.endpoint.name, "model": r.model.name, "version": r.model.version,
            "state": r.state, "steps": r.steps, "step": r.step_index, "weight": r.steps[r.step_index],
            "interval_s": r.interval_s, "gates": r.gates, "reason": r.reason, "history": r.history,
            "started_at": _aware(r.started_at).isoformat(), "updated_at": _aware(r.updated_at).isoformat(),
            "next_step_at": _aware(r.next_step_at).isoformat() if r.next_step_at else None}


@dataclass
class Rollouts:
    registry: Registry
    source: MetricsSource
    clock: Callable[[], datetime] = utcnow

    def __post_init__(self) -> None:
        self._baselines: dict[int, Counters | None] = {}

    # --- API ------------------------------------------------------------------------------
    def start(self, req: schemas.RolloutStart, actor: str = "anonymous") -> dict[str, Any]:
        with self.registry.sessions() as s:
            ep = s.scalar(select(Endpoint).where(Endpoint.name == req.endpoint))
            if ep is None:
                raise NotFound(f"endpoint {req.endpoint} not found")
            live = s.scalar(select(Rollout.state).where(Rollout.endpoint_id == ep.id, Rollout.state.in_(LIVE)))
            if live:
                raise Conflict(f"endpoint {req.endpoint} already has a rollout {live}; abort it first")
            engine = ep.engine
        # the candidate joins as a canary (checks: model exists, fits the engine, a stable version exists)
        self.registry.deploy(schemas.EndpointDeploy(endpoint=req.endpoint, model=req.model, version=req.version,
                                                    engine=engine, canary=min(req.steps[0], 99.0)))
        now = self.clock()
        with self.registry.sessions() as s:
            ep = s.scalar(select(Endpoint).where(Endpoint.name == req.endpoint))
            candidate = next(t for t in ep.targets if t.role == "canary")
            _split(ep, candidate.model_id, req.steps[0])
            r = Rollout(endpoint=ep, model=candidate.model, state="running", steps=list(req.steps), step_index=0,
                        interval_s=req.interval_s, gates=req.gates(), reason="", started_at=now, updated_at=now,
                        next_step_at=now + timedelta(seconds=req.interval_s),
                        history=[_event(now, f"started by {actor}", 0, req.steps[0])])
            s.add(r)  # the API call itself is in the audit log (registry/audit.py)
            self.registry._commit(s)
            self._baselines[r.id] = self.source.snapshot(req.endpoint, candidate.model.version)
            return rollout_out(r)

    def list(self, endpoint: str | None = None) -> list[dict[str, Any]]:
        with self.registry.sessions() as s:
            q = select(Rollout).order_by(Rollout.id.desc())
            if endpoint:
                q = q.join(Endpoint).where(Endpoint.name == endpoint)
            return [rollout_out(r) for r in s.scalars(q)]

    def abort(self, endpoint: str, actor: str = "anonymous") -> dict[str, Any]:
        with self.registry.sessions() as s:
            r = self._live(s, endpoint)
            self._finish(s, r, "aborted", f"aborted by {actor}", keep="stable", actor=actor)
            return rollout_out(r)

    def pause(self, endpoint: str, actor: str = "anonymous") -> dict[str, Any]:
        """The rollout keeps its step's share; no step is taken and no gate judged until ``resume``."""
        now = self.clock()
        with self.registry.sessions() as s:
            r = self._live(s, endpoint)
            if r.state == "paused":
                raise Conflict(f"the rollout on endpoint {endpoint} is already paused; resume it or abort it")
            step = r.step_index
            why = f"paused by {actor} at step {step + 1} ({r.steps[step]:g}%)"
            claimed = s.execute(update(Rollout).where(Rollout.id == r.id, Rollout.state == "running",
                                                      Rollout.step_index == step)
                                .values(state="paused", next_step_at=None, updated_at=now, reason=why,
                                        history=[*r.history, _event(now, why, step, r.steps[step])]))
            if claimed.rowcount != 1:  # the controller took a step or a decision meanwhile
                s.rollback()
                raise Conflict(f"the rollout on endpoint {endpoint} changed meanwhile; look at it and try again")
            s.commit()
            s.refresh(r)
            self._baselines.pop(r.id, None)
            return rollout_out(r)

    def resume(self, endpoint: str, actor: str = "anonymous") -> dict[str, Any]:
        """A paused rollout goes on at its step, judged on a fresh window of a whole interval."""
        now = self.clock()
        with self.registry.sessions() as s:
            r = self._live(s, endpoint)
            if r.state != "paused":
                raise Conflict(f"the rollout on endpoint {endpoint} is {r.state}, not paused")
            step = r.step_index
            r.state, r.reason, r.updated_at = "running", "", now
            r.next_step_at = now + timedelta(seconds=r.interval_s)
            r.history = [*r.history, _event(now, f"resumed by {actor}", step, r.steps[step])]
            s.commit()
            self._baselines[r.id] = self.source.snapshot(endpoint, r.model.version)
            return rollout_out(r)

    @staticmethod
    def _live(s: Session, endpoint: str) -> Rollout:
        r = s.scalar(select(Rollout).join(Endpoint).where(Endpoint.name == endpoint, Rollout.state.in_(LIVE)))
        if r is None:
            raise NotFound(f"endpoint {endpoint} has no rollout running or paused")
        return r

    # --- controller -----------------------------------------------------------------------
    def resume_after_restart(self) -> int:
        """After a restart: every running rollout continues at its step with a fresh window."""
        now = self.clock()
        with self.registry.sessions() as s:
            running = list(s.scalars(select(Rollout).where(Rollout.state == "running")))
            for r in running:
                r.next_step_at = now + timedelta(seconds=r.interval_s)
                r.history = [*r.history, _event(now, "resumed after a control-plane restart", r.step_index,
                                                r.steps[r.step_index])]
                self._baselines[r.id] = self.source.snapshot(r.endpoint.name, r.model.version)
            s.commit()
            return len(running)

    def tick(self) -> None:
        now = self.clock()
        with self.registry.sessions() as s:
            live = list(s.scalars(select(Rollout).where(Rollout.state.in_(LIVE))))
            self._follow_other_replicas(live)
            due = [r.id for r in live if r.state == "running"
                   and (_aware(r.next_step_at) is None or _aware(r.next_step_at) <= now)]
        for rollout_id in due:
            try:
                self._step(rollout_id, now)
            except Exception:  # one rollout's trouble must not stop the others
                log.exception("rollout %s: step failed", rollout_id)

    def _follow_other_replicas(self, live: list[Rollout]) -> None:
        """Baselines of rollouts started, paused or resumed through another control-plane replica,
        which took its own: a running rollout without one here gets one now (its window starts at
        most a tick late); a paused one drops its own, so that its resume starts a fresh window."""
        for r in live:
            if r.state == "paused":
                self._baselines.pop(r.id, None)
            elif r.id not in self._baselines:
                self._baselines[r.id] = self.source.snapshot(r.endpoint.name, r.model.version)

    def _step(self, rollout_id: int, now: datetime) -> None:
        with self.registry.sessions() as s:
            r = s.get(Rollout, rollout_id)
            if r is None or r.state != "running":
                return
            endpoint, version, step = r.endpoint.name, r.model.version, r.step_index
            try:
                window = self.source.window(endpoint, version, self._baselines.get(r.id), r.interval_s)
            except ConnectionError as exc:
                self._hold(s, r, now, f"holding: {exc}")
                return
            observed = {"requests": window.requests, "error_rate": round(window.error_rate, 4),
                        "p99_ms": None if window.p99_s is None else round(window.p99_s * 1000, 1),
                        "drift": window.drift, **_llm_observed(window)}
            if window.requests < r.gates.get("min_requests", 1):
                self._hold(s, r, now, f"holding: {int(window.requests)} request(s) reached the candidate, "
                                      f"{r.gates.get('min_requests', 1)} needed to judge", observed, keep_baseline=True)
                return
            failure = gate_failure(window, r.gates)
            if failure is None and r.gates.get("max_accuracy_drop") is not None:
                stable = next((t.model.version for t in r.endpoint.targets if t.role == "stable"), None)
                try:
                    candidate_q, stable_q = self.source.quality(endpoint, version), self.source.quality(endpoint, stable)
                except ConnectionError as exc:
                    self._hold(s, r, now, f"holding: {exc}", observed, keep_baseline=True)
                    return
                observed |= {"accuracy": candidate_q.accuracy, "labelled": candidate_q.labelled,
                             "stable_accuracy": stable_q.accuracy, "stable_labelled": stable_q.labelled}
                hold, failure = accuracy_verdict(candidate_q, stable_q, r.gates)
                if hold:
                    self._hold(s, r, now, hold, observed, keep_baseline=True)
                    return
            if (failure or step == len(r.steps) - 1) and not _claim(s, r, step):
                return  # paused, aborted or judged by another control plane meanwhile
            if failure:
                self._finish(s, r, "rolled_back", f"rolled back at step {step + 1} ({r.steps[step]:g}%): {failure}",
                             keep="stable", observed=observed)
            elif step == len(r.steps) - 1:
                self._finish(s, r, "succeeded", f"promoted: every gate passed at all {len(r.steps)} steps",
                             keep="candidate", observed=observed)
            else:
                weight = r.steps[step + 1]
                claimed = s.execute(update(Rollout).where(Rollout.id == r.id, Rollout.state == "running",
                                                          Rollout.step_index == step)
                                    .values(step_index=step + 1, updated_at=now,
                                            next_step_at=now + timedelta(seconds=r.interval_s),
                                            history=[*r.history, _event(now, "gates passed", step + 1, weight, observed)]))
                if claimed.rowcount != 1:
                    s.rollback()  # paused, aborted, or another control plane took this step
                    return
                s.expire(r)
                _split(r.endpoint, r.model_id, weight)
                self.registry._commit(s)
                self._baselines[r.id] = self.source.snapshot(endpoint, version)

    def _hold(self, s: Session, r: Rollout, now: datetime, why: str, observed: dict | None = None,
              keep_baseline: bool = False) -> None:
        if not _claim(s, r, r.step_index):
            return
        r.next_step_at = now + timedelta(seconds=r.interval_s)
        r.reason = why
        last = r.history[-1] if r.history else {}
        if last.get("event") != why:
            r.history = [*r.history, _event(now, why, r.step_index, r.steps[r.step_index], observed)]
        s.commit()
        if not keep_baseline:
            self._baselines[r.id] = self.source.snapshot(r.endpoint.name, r.model.version)

    def _finish(self, s: Session, r: Rollout, state: str, reason: str, keep: str, observed: dict | None = None,
                actor: str = ACTOR) -> None:
        now = self.clock()
        ep = r.endpoint
        if keep == "candidate":
            candidate = next(t for t in ep.targets if t.model_id == r.model_id)
            for t in [t for t in ep.targets if t.role in ("stable", "canary") and t is not candidate]:
                ep.targets.remove(t)
            candidate.role, candidate.weight = "stable", 100.0
        else:
            for t in [t for t in ep.targets if t.model_id == r.model_id and t.role == "canary"]:
                ep.targets.remove(t)
            for t in ep.targets:
                if t.role == "stable":
                    t.weight = 100.0
        r.state, r.reason, r.next_step_at, r.updated_at = state, reason, None, now
        weight = 100.0 if keep == "candidate" else 0.0
        r.history = [*r.history, _event(now, reason, r.step_index, weight, observed)]
        if actor == ACTOR:  # the controller's own decisions; API calls are audited as they come in
            s.add(AuditEntry(at=now, actor=actor, action=f"rollout.{state}", target=ep.name,
                             detail={"version": r.model.version, "reason": reason}))
        self.registry._commit(s)
        self._baselines.pop(r.id, None)


def _claim(s: Session, r: Rollout, step: int) -> bool:
    """Whether the rollout is still running at ``step`` (checked in the database, in this transaction,
    so a pause or abort committed since it was read wins over the decision about to be made)."""
    still = s.execute(update(Rollout).where(Rollout.id == r.id, Rollout.state == "running", Rollout.step_index == step)
                      .values(updated_at=r.updated_at))
    if still.rowcount != 1:
        s.rollback()
        return False
    return True


def _split(ep: Endpoint, candidate_model_id: int, weight: float) -> None:
    """The candidate takes ``weight`` percent, the stable version the rest; shadows keep their share."""
    for t in ep.targets:
        if t.model_id == candidate_model_id:
            t.weight = float(weight)
        elif t.role == "stable":
            t.weight = 100.0 - float(weight)
        elif t.role == "canary":
            t.weight = 0.0


def _llm_observed(window: Window) -> dict[str, float]:
    """The LLM figures of a window, those it has (encoder endpoints' history stays as it was)."""
    return {f"{name[:-2]}_ms": round(getattr(window, name) * 1000, 1)
            for _, name, _ in LLM_GATES if getattr(window, name) is not None}


def _event(at: datetime, event: str, step: int, weight: float, observed: dict | None = None) -> dict[str, Any]:
    return {"at": at.isoformat(), "event": event, "step": step, "weight": weight, **({"observed": observed} if observed else {})}


class RolloutController:
    """Ticks the rollouts from a thread of the control-plane process while ``leads()`` says this
    process is the leader (always, by default); each time it becomes the leader, before its first
    tick, every running rollout is resumed with a fresh window."""

    def __init__(self, rollouts: Rollouts, period_s: float = 0.5, leads: Callable[[], bool] = lambda: True) -> None:
        self.rollouts = rollouts
        self.period_s = period_s
        self.leads = leads
        self._leading = False  # whether the running rollouts were resumed since this process leads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RolloutController":
        self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self._once()
            if self._stop.wait(self.period_s):
                return

    def _once(self) -> None:
        if not self.leads():
            self._leading = False
            return
        if not self._leading:
            try:
                resumed = self.rollouts.resume_after_restart()
            except Exception:  # tried again next period; no tick judges a window this process did not open
                log.exception("could not resume rollouts")
                return
            if resumed:
                log.info("resumed %d running rollout(s)", resumed)
            self._leading = True
        try:
            self.rollouts.tick()
        except Exception:
            log.exception("rollout tick failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
