"""`serving llm`: vLLM OpenAI servers for the model versions ``vllm`` endpoints deploy, ``replicas`` of each.

It follows the control plane's snapshots as the workers and the embedded Triton do. For each
engine it fetches the folder by hash, unpacks it once, and starts vLLM on a free port of 127.0.0.1
under serving/supervisor.py's supervision (the code `serving up` uses for its children): an engine
that dies is started again after a backoff, and one that crash-loops is given up with the reason
(the last error line of its log) as its state. ``ready`` means its ``/health`` answered 200.
An engine no longer deployed is stopped once every deployed one has settled (ready or failed) and
``UNLOAD_GRACE_S`` later: workers keep a replaced version until its successor is ready.

Workers read where each engine answers from ``GET /engines`` (serving/llm/launch/http.py); the control
plane gets the failures in a readiness report (``kind: "llm"``), so `serving model add --wait` says why.

Replicas (``--aux-config replicas=N``): each is a process of its own on a port of its own, supervised
apart (one dying leaves the others serving and is restarted alone), placed on its own cores or GPUs
(serving/llm/launch/placement.py). The number changes without restarting the others: new slots start, the
highest ones stop.

A change of what an engine computes under the same key (the first LoRA adapter turns LoRA on, or a
larger rank is needed) replaces it without losing a request: the new replicas start beside the old
ones (serving/llm/launch/replacement.py), which keep serving until every new one is ready; then ``GET
/engines`` shows the new ones, and the old ones stop once idle. Both run meanwhile: on a GPU with
room for one, give the base's endpoint ``max_lora_rank`` so that its engine starts with LoRA on.

Scale to zero (``--aux-config scale_to_zero_after_s=N``): an engine idle that long has its processes stopped
and is shown ``scaled_to_zero`` until a worker holding a request wakes it (serving/llm/launch/sleep.py).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from serving.llm.adapters.loading import AdapterFolders, sync_adapters
from serving.llm.launch.process import (
    EngineSpec, engine_env, last_error, log_size, remove_segments, shm_segments, start_engine,
    vllm_command, wanted_engines,
)
from serving.llm.launch.memory import EngineMemory
from serving.llm.launch.placement import replica_env
from serving.llm.launch.replacement import Replacements
from serving.llm.launch.sleep import Sleep, engine_states
from serving.ports import free_port
from serving.settings import LLMSettings
from serving.supervisor import Child, Supervisor, describe_exit

log = logging.getLogger(__name__)

UNLOAD_GRACE_S = 5.0
DRAIN_S = 300.0            # a replaced engine's requests get this long to finish (replacement.py)
CRASH_WINDOW_S = 900.0     # an engine takes about 45 s to start: a crash loop is slow
VIEW_WAIT_S = 0.5          # GET /engines answers the last map past this wait for the tick (view())


@dataclass
class Engine:
    """One replica: one vLLM OpenAI server (and its EngineCore), on a port of its own."""

    key: str                            # the engine's key (naming.engine_key), shared by its replicas
    slot: int                           # 0, 1, ...: its id, stable across restarts
    port: int
    supervisor: Supervisor
    state: str = "starting"             # starting | ready | failed
    error: str | None = None
    spawned_at: float | None = None
    log_path: Path | None = None
    log_mark: int = 0                   # the log's size when the running process started
    exit_code: int | None = None        # of the last process that died
    shm: set[str] = field(default_factory=set)  # /dev/shm segments its processes mapped
    adapters: dict[str, str] = field(default_factory=dict)        # LoRA adapters loaded: name -> artifact
    adapter_errors: dict[str, str] = field(default_factory=dict)  # adapters it refused: name -> why
    generation: int = 0                 # how many times the key's engine was replaced (replacement.py)

    @property
    def name(self) -> str:
        """In logs, log file names and the memory budget: the key, ``#slot`` added past the first, and
        ``~N`` for the Nth replacement (which runs beside the one it replaces)."""
        name = self.key if self.slot == 0 else f"{self.key}#{self.slot}"
        return f"{name}~{self.generation}" if self.generation else name

    @property
    def proc(self):
        return self.supervisor.children[0].proc if self.supervisor.children else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def view(self) -> dict[str, Any]:
        return {"id": str(self.slot), "url": self.url, "state": self.state, "error": self.error,
                "adapters": sorted(self.adapters)}


@dataclass
class EngineSet:
    """A model version's engine (for one set of launch options): its folder and its replicas."""

    spec: EngineSpec
    replicas: list[Engine] = field(default_factory=list)
    model_dir: Path | None = None       # set once the folder is unpacked
    preparing: threading.Thread | None = None
    unpack_error: str | None = None     # the folder could not be fetched or unpacked: every replica fails
    generation: int = 0                 # its replicas' (Engine.generation)

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def all_ready(self) -> bool:
        return bool(self.replicas) and all(r.state == "ready" for r in self.replicas)

    def view(self) -> dict[str, Any]:
        """Ready while any replica is; ``url`` the first ready one's (what a worker without replica
        routing uses); ``error`` a replica's when none is ready."""
        views = [r.view() for r in self.replicas]
        states = {v["state"] for v in views}
        state = "ready" if "ready" in states else "starting" if "starting" in states or not views else "failed"
        first = next((v for v in views if v["state"] == "ready"), views[0] if views else None)
        errors = [(v["id"], v["error"]) for v in views if v["error"]]
        error = None
        if state != "ready" and errors:
            error = errors[0][1] if len(views) == 1 else f"replica {errors[0][0]}: {errors[0][1]}"
        return {"url": first["url"] if first else None, "served_model_name": self.key, "state": state,
                "error": error, "replicas": views}


class Launcher:
    def __init__(self, settings: LLMSettings, artifact_path: Callable[[str], Path],
                 on_change: Callable[[], None] = lambda: None, sleep: Sleep | None = None) -> None:
        self.settings = settings
        self.artifact_path = artifact_path
        self.on_change = on_change          # a state changed: report readiness now
        self.log_dir = settings.home / "logs" / "llm"
        self.unpack_root = settings.home / "llm-models"
        self.engines: dict[str, EngineSet] = {}
        self.wanted: dict[str, EngineSpec] = {}
        self.unwanted_since: dict[str, float] = {}
        self.revision = -1
        self.memory = EngineMemory(settings.llm_memory_budget_mb)
        self.replacements = Replacements(self._stop_replica, UNLOAD_GRACE_S, DRAIN_S)
        self.adapters = AdapterFolders(artifact_path, self.unpack_root)
        self.sleep = sleep or Sleep()
        self.lock = threading.RLock()
        self._last_view: dict[str, Any] = {"engines": {}}
        self.closed = False

    # --- what the snapshot asks for -------------------------------------------------
    def apply(self, snapshot: dict[str, Any]) -> None:
        """ConfigSubscriber callback: quick (fetching happens on a thread of its own, starting in ``tick``)."""
        with self.lock:
            self.wanted = wanted_engines(snapshot)
            self.revision = int(snapshot.get("revision", -1))
            for key, spec in self.wanted.items():
                engine = self.engines.get(key)
                generation = 0
                if engine is not None and not engine.spec.same_engine(spec):  # new options, LoRA or folder
                    generation = engine.generation + 1
                    if self.replacements.retire(engine):  # it serves until its successor is ready
                        self.engines.pop(key)
                    else:
                        log.info("engine %s changed (options, LoRA or folder); restarting it", key)
                        self._stop(key)
                    engine = None
                if engine is None:
                    self.engines[key] = self._new(spec, generation)
                else:
                    engine.spec = spec
                self._scale(self.engines[key])
                self.adapters.prepare(spec.adapters.values())
        # engines are started by ``tick`` on the launcher's main thread: PR_SET_PDEATHSIG follows the thread
        # that forks, and that one lives as long as the launcher

    def _new(self, spec: EngineSpec, generation: int = 0) -> EngineSet:
        engine = EngineSet(spec, generation=generation)
        self._scale(engine)
        engine.preparing = threading.Thread(target=self._prepare, args=(engine,), name=f"llm-prepare-{spec.key}",
                                            daemon=True)
        engine.preparing.start()
        return engine

    def _scale(self, engine: EngineSet) -> None:
        """As many replicas as the spec says: new slots are added, the highest ones stopped."""
        while len(engine.replicas) < engine.spec.replicas:
            sup = Supervisor({}, self.log_dir, max_crashes=self.settings.llm_max_crashes,
                             crash_window_s=CRASH_WINDOW_S)
            engine.replicas.append(Engine(engine.key, len(engine.replicas), free_port(), sup,
                                          generation=engine.generation))
        while len(engine.replicas) > engine.spec.replicas:
            self._stop_replica(engine.replicas.pop())
            self.on_change()

    def _prepare(self, engine: EngineSet) -> None:
        """Fetch and unpack the folder (minutes for a large model: off the tick thread)."""
        from preprocess.loader import unpack_tokenizer as unpack_once  # a tar unpacked once per content hash

        try:
            engine.model_dir = unpack_once(self.artifact_path(engine.spec.artifact), self.unpack_root)
        except Exception as exc:
            log.exception("cannot fetch or unpack the folder of %s", engine.key)
            engine.unpack_error = f"cannot fetch or unpack the model folder: {exc}"

    # --- the loop ---------------------------------------------------------------------
    def tick(self) -> None:
        """Start what is prepared, notice deaths and readiness, stop what is no longer wanted."""
        with self.lock:
            if self.closed:
                return
            for engine in list(self.engines.values()):
                if engine.key not in self.wanted or self.sleep.asleep(engine.key):
                    continue
                for replica in engine.replicas:
                    if engine.unpack_error:
                        self._set(replica, "failed", engine.unpack_error)
                    elif engine.model_dir is not None:
                        self._watch(engine, replica)
            self.replacements.tick({k: e for k, e in self.engines.items() if k in self.wanted}, self.on_change)
            self._sleep_idle()
            self._stop_unwanted()

    def _watch(self, engine: EngineSet, replica: Engine) -> None:
        if replica.state == "failed" and replica.supervisor.children and replica.proc is None:
            return  # given up after a crash loop (a new deploy makes a new engine)
        if not replica.supervisor.children:
            self._spawn(engine, replica)
            return
        if replica.proc is not None and replica.proc.poll() is not None:
            replica.exit_code = replica.proc.returncode
        if not replica.supervisor.check():  # a crash loop: given up
            self._after_death(replica)
            self._set(replica, "failed", self._why(replica, "crash-looped: it"))
            return
        proc = replica.proc
        if proc is None:  # died: the supervisor restarts it after a backoff
            self._after_death(replica)
            self._set(replica, "starting", self._why(replica, "") + "; restarting")
            replica.spawned_at = None
            return
        if replica.spawned_at is None:
            replica.spawned_at = time.monotonic()
        if replica.state == "starting":
            replica.shm |= shm_segments(proc.pid)  # what it maps so far: a death while starting leaves it too
            if self._healthy(replica):
                self.memory.measured(replica.name, proc.pid)
                self._set(replica, "ready", None)
            elif time.monotonic() - replica.spawned_at > self.settings.vllm_start_timeout_s:
                log.warning("engine %s did not answer /health in %.0fs; killing it", replica.name,
                            self.settings.vllm_start_timeout_s)
                proc.kill()
        if replica.state == "ready" and sync_adapters(replica, engine.spec.adapters, self.adapters):
            self.on_change()

    def _spawn(self, engine: EngineSet, replica: Engine) -> None:
        python = self.settings.vllm_python
        if python is None or not Path(python).exists():
            self._set(replica, "failed", f"no vLLM interpreter ({python or '.venv-vllm not found'}): run "
                                         "scripts/setup.sh or set SERVING_VLLM_PYTHON")
            return
        try:
            placement = replica_env(replica.slot, engine.spec.replicas,
                                    int(engine.spec.options.get("tensor_parallel_size") or 1), self.settings.llm_gpus)
        except ValueError as exc:
            self._set(replica, "failed", str(exc))
            return
        others = [r.proc.pid for e in self.engines.values() for r in e.replicas if r.proc is not None and r is not replica]
        room = self.memory.refusal(replica.name, [*others, *self.replacements.pids()])
        if room is not None:
            self._set(replica, "failed", room)  # tried again at each tick: an engine stopped frees room
            return
        command = vllm_command(Path(python), engine.spec, engine.model_dir, replica.port, self.settings.vllm_kv_cache_gb,
                               self.settings.vllm_default_args, self.settings.tracing_otlp_endpoint)
        replica.log_path = self.log_dir / f"{replica.name.replace('/', '_')}.log"
        placement |= engine_env(engine.spec, self.settings.tracing_otlp_endpoint)
        child = Child(replica.name, [], None, spawn=lambda: self._process(replica, command, placement))
        replica.supervisor.start(child)
        replica.spawned_at = time.monotonic()
        self._set(replica, "starting", None)
        log.info("started engine %s on 127.0.0.1:%d (pid %d)%s: %s", replica.name, replica.port, child.proc.pid,
                 "".join(f" {k}={v}" for k, v in placement.items()), " ".join(command))

    def _process(self, replica: Engine, command: list[str], placement: dict[str, str]):
        """The supervisor's way to start (and restart) this replica's process."""
        replica.log_mark = log_size(replica.log_path)
        return start_engine(command, replica.log_path, placement)

    def _after_death(self, replica: Engine) -> None:
        """Its process group is gone (the supervisor killed what was left): unlink the shared memory it held;
        the adapters it had loaded are loaded again once it is back."""
        remove_segments(replica.shm)
        replica.shm = set()
        replica.adapters, replica.adapter_errors = {}, {}

    def _why(self, replica: Engine, what: str) -> str:
        exits = len(replica.supervisor.children[0].crashes)
        reason = last_error(replica.log_path, replica.log_mark) if replica.exit_code != -9 else None
        return (f"engine {what} {describe_exit(replica.exit_code)} ({exits} exit(s) in {CRASH_WINDOW_S:.0f}s)"
                .replace("  ", " ") + (f": {reason}" if reason else ""))

    def _healthy(self, replica: Engine) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{replica.port}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _set(self, replica: Engine, state: str, error: str | None) -> None:
        if (replica.state, replica.error) == (state, error):
            return
        replica.state, replica.error = state, error
        log.info("engine %s: %s%s", replica.name, state, f" ({error})" if error else "")
        self.on_change()

    def _stop_unwanted(self) -> None:
        now = time.monotonic()
        unwanted = [k for k in self.engines if k not in self.wanted]
        self.unwanted_since = {k: t for k, t in self.unwanted_since.items() if k in unwanted}
        if any(r.state == "starting" for k in self.wanted if k in self.engines and not self.sleep.asleep(k)
               for r in self.engines[k].replicas):
            return
        for key in unwanted:
            if now - self.unwanted_since.setdefault(key, now) >= UNLOAD_GRACE_S:
                self._stop(key)

    # --- scale to zero (sleep.py) --------------------------------------------------------
    def _sleep_idle(self) -> None:
        """Each engine that may sleep and did no work for its ``scale_to_zero_after_s`` stops its processes;
        fresh replicas (not started) wait for a wake. The map says so before the processes stop."""
        self.sleep.retain(set(self.wanted))
        for key, engine in list(self.engines.items()):
            if key not in self.wanted or key in self.replacements.retiring or engine.unpack_error:
                continue
            view = engine.view()
            self.sleep.measure(key, view)
            if not self.sleep.due(key, engine.spec.options.get("scale_to_zero_after_s"), view):
                continue
            self.sleep.slept(key)
            self.view()  # the last map read now says scaled_to_zero (the stops below take a while)
            self.on_change()
            for replica in engine.replicas:
                self._stop_replica(replica)
            engine.replicas = []
            self._scale(engine)

    def wake(self, key: str) -> dict[str, Any] | None:
        """``POST /engines/wake``: a worker holds a request for this engine. Idempotent; None for an engine not
        deployed here. Never waits for a tick: the next one starts the replicas."""
        if key not in self.wanted or key not in self.engines:
            return None
        if self.sleep.wake(key):
            self.on_change()
        state = "starting" if self.sleep.waking(key) else (self._last_view["engines"].get(key) or {}).get("state")
        return {"engine": key, "state": state or "starting"}

    def _stop(self, key: str) -> None:
        engine = self.engines.pop(key)
        self.unwanted_since.pop(key, None)
        for replica in engine.replicas:
            self._stop_replica(replica)
        log.info("stopped engine %s", key)
        self.on_change()

    def _stop_replica(self, replica: Engine) -> None:
        self.memory.forget(replica.name)
        replica.supervisor.stop_all(timeout=15.0)
        self._after_death(replica)

    # --- what others read ---------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """``GET /engines``: the engines of deployed versions (stopping ones are left out).

        Never waits long for the tick: a tick holds the lock while it stops an engine (up to 15 s) or
        forks one, and every worker reads this map. Past ``VIEW_WAIT_S`` the last map read is answered:
        at most one tick old, as any read of it is by the time a worker acts on it."""
        if not self.lock.acquire(timeout=VIEW_WAIT_S):
            return self._last_view
        try:
            self._last_view = {"engines": {k: self._marked(e, self.replacements.serving(e).view())
                                           for k, e in self.engines.items() if k in self.wanted}}
            return self._last_view
        finally:
            self.lock.release()

    def _marked(self, engine: EngineSet, view: dict[str, Any]) -> dict[str, Any]:
        """``view`` as scale to zero shows it (asleep, waking, the last cold start)."""
        return self.sleep.mark(engine.key, view, engine.spec.options.get("scale_to_zero_after_s"))

    def readiness(self) -> dict[str, Any]:
        """Engines none of whose replicas can serve, and adapters an engine refused, with why; and each
        engine's state for the console (scaled to zero, waking, the last cold start)."""
        with self.lock:
            # the engine itself, not the one it replaces that serves meanwhile: its failure is reported
            views = {k: self._marked(e, e.view()) for k, e in self.engines.items() if k in self.wanted}
            failures = {k: v["error"] or "failed" for k, v in views.items() if v["state"] == "failed"}
            for engine in self.engines.values():
                for replica in engine.replicas:
                    for name, why in replica.adapter_errors.items():
                        failures.setdefault(name, why)
            return {"revision": self.revision, "failures": failures, "engines": engine_states(views)}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.replacements.close()
            for key in list(self.engines):
                self._stop(key)
