"""`serving llm`: one vLLM OpenAI server per model version that a ``vllm`` endpoint deploys.

It follows the control plane's snapshots as the workers and the embedded Triton do. For each
engine it fetches the folder by hash, unpacks it once, and starts vLLM on a free port of 127.0.0.1
under serving/supervisor.py's supervision (the code `serving up` uses for its children): an engine
that dies is started again after a backoff, and one that crash-loops is given up with the reason
(the last error line of its log) as its state. ``ready`` means its ``/health`` answered 200.
An engine no longer deployed is stopped once every deployed one has settled (ready or failed) and
``UNLOAD_GRACE_S`` later: workers keep a replaced version until its successor is ready.

Workers read where each engine answers from ``GET /engines`` (serving/llm/http.py); the control
plane gets the failures in a readiness report (``kind: "llm"``), so `serving model add --wait` says why.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from serving.llm.engine_process import (
    EngineSpec, free_port, last_error, log_size, remove_segments, shm_segments, start_engine, vllm_command,
    wanted_engines,
)
from serving.llm.memory import EngineMemory
from serving.settings import LLMSettings
from serving.supervisor import Child, Supervisor, describe_exit

log = logging.getLogger(__name__)

UNLOAD_GRACE_S = 5.0
MAX_CRASHES = 3            # exits within CRASH_WINDOW_S before an engine is given up (failed)
CRASH_WINDOW_S = 900.0     # an engine takes about 45 s to start: a crash loop is slow


@dataclass
class Engine:
    spec: EngineSpec
    port: int
    supervisor: Supervisor
    state: str = "starting"             # starting | ready | failed
    error: str | None = None
    model_dir: Path | None = None       # set once the folder is unpacked
    spawned_at: float | None = None
    preparing: threading.Thread | None = None
    log_path: Path | None = None
    log_mark: int = 0                   # the log's size when the running process started
    exit_code: int | None = None        # of the last process that died
    shm: set[str] = field(default_factory=set)  # /dev/shm segments its processes mapped

    @property
    def proc(self):
        return self.supervisor.children[0].proc if self.supervisor.children else None

    def view(self) -> dict[str, Any]:
        return {"url": f"http://127.0.0.1:{self.port}/v1", "served_model_name": self.spec.key,
                "state": self.state, "error": self.error}


class Launcher:
    def __init__(self, settings: LLMSettings, artifact_path: Callable[[str], Path],
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.artifact_path = artifact_path
        self.on_change = on_change          # a state changed: report readiness now
        self.log_dir = settings.home / "logs" / "llm"
        self.unpack_root = settings.home / "llm-models"
        self.engines: dict[str, Engine] = {}
        self.wanted: dict[str, EngineSpec] = {}
        self.unwanted_since: dict[str, float] = {}
        self.revision = -1
        self.memory = EngineMemory(settings.llm_memory_budget_mb)
        self.lock = threading.RLock()
        self.closed = False

    # --- what the snapshot asks for -------------------------------------------------
    def apply(self, snapshot: dict[str, Any]) -> None:
        """ConfigSubscriber callback: quick (fetching and starting happen in ``tick``)."""
        with self.lock:
            self.wanted = wanted_engines(snapshot)
            self.revision = int(snapshot.get("revision", -1))
            for key, spec in self.wanted.items():
                engine = self.engines.get(key)
                if engine is not None and engine.spec != spec:  # new options or artifact: a new engine
                    log.info("engine %s changed (options or folder); restarting it", key)
                    self._stop(key)
                if key not in self.engines:
                    self.engines[key] = self._new(spec)
        self.tick()

    def _new(self, spec: EngineSpec) -> Engine:
        sup = Supervisor({}, self.log_dir, max_crashes=MAX_CRASHES, crash_window_s=CRASH_WINDOW_S)
        engine = Engine(spec, free_port(), sup)
        engine.preparing = threading.Thread(target=self._prepare, args=(engine,), name=f"llm-prepare-{spec.key}",
                                            daemon=True)
        engine.preparing.start()
        return engine

    def _prepare(self, engine: Engine) -> None:
        """Fetch and unpack the folder (minutes for a large model: off the tick thread)."""
        from preprocess.loader import unpack_tokenizer as unpack_once  # a tar unpacked once per content hash

        try:
            engine.model_dir = unpack_once(self.artifact_path(engine.spec.artifact), self.unpack_root)
        except Exception as exc:
            log.exception("cannot fetch or unpack the folder of %s", engine.spec.key)
            self._set(engine, "failed", f"cannot fetch or unpack the model folder: {exc}")

    # --- the loop ---------------------------------------------------------------------
    def tick(self) -> None:
        """Start what is prepared, notice deaths and readiness, stop what is no longer wanted."""
        with self.lock:
            if self.closed:
                return
            for engine in list(self.engines.values()):
                if engine.spec.key in self.wanted:
                    self._watch(engine)
            self._stop_unwanted()

    def _watch(self, engine: Engine) -> None:
        if engine.model_dir is None or (engine.state == "failed" and engine.supervisor.children
                                        and engine.proc is None):
            return  # still fetching, or given up after a crash loop (a new deploy makes a new engine)
        if not engine.supervisor.children:
            self._spawn(engine)
            return
        if engine.proc is not None and engine.proc.poll() is not None:
            engine.exit_code = engine.proc.returncode
        if not engine.supervisor.check():  # a crash loop: given up
            self._after_death(engine)
            self._set(engine, "failed", self._why(engine, "crash-looped: it"))
            return
        proc = engine.proc
        if proc is None:  # died: the supervisor restarts it after a backoff
            self._after_death(engine)
            self._set(engine, "starting", self._why(engine, "") + "; restarting")
            engine.spawned_at = None
            return
        if engine.spawned_at is None:
            engine.spawned_at = time.monotonic()
        if engine.state == "starting":
            if self._healthy(engine):
                self.memory.measured(engine.spec.key, proc.pid)
                engine.shm = shm_segments(proc.pid)
                self._set(engine, "ready", None)
            elif time.monotonic() - engine.spawned_at > self.settings.vllm_start_timeout_s:
                log.warning("engine %s did not answer /health in %.0fs; killing it", engine.spec.key,
                            self.settings.vllm_start_timeout_s)
                proc.kill()

    def _spawn(self, engine: Engine) -> None:
        python = self.settings.vllm_python
        if python is None or not Path(python).exists():
            self._set(engine, "failed", f"no vLLM interpreter ({python or '.venv-vllm not found'}): run "
                                        "scripts/setup.sh or set SERVING_VLLM_PYTHON")
            return
        room = self.memory.refusal(engine.spec.key, [e.proc.pid for e in self.engines.values()
                                                      if e.proc is not None and e is not engine])
        if room is not None:
            self._set(engine, "failed", room)  # tried again at each tick: an engine stopped frees room
            return
        command = vllm_command(Path(python), engine.spec, engine.model_dir, engine.port, self.settings.vllm_kv_cache_gb)
        engine.log_path = self.log_dir / f"{engine.spec.key.replace('/', '_')}.log"
        child = Child(engine.spec.key, [], None, spawn=lambda: self._process(engine, command))
        engine.supervisor.start(child)
        engine.spawned_at = time.monotonic()
        self._set(engine, "starting", None)
        log.info("started engine %s on 127.0.0.1:%d (pid %d): %s", engine.spec.key, engine.port, child.proc.pid,
                 " ".join(command))

    def _process(self, engine: Engine, command: list[str]):
        """The supervisor's way to start (and restart) this engine's process."""
        engine.log_mark = log_size(engine.log_path)
        return start_engine(command, engine.log_path)

    def _after_death(self, engine: Engine) -> None:
        """Its process group is gone (the supervisor killed what was left): unlink the shared memory it held."""
        remove_segments(engine.shm)
        engine.shm = set()

    def _why(self, engine: Engine, what: str) -> str:
        exits = len(engine.supervisor.children[0].crashes)
        reason = last_error(engine.log_path, engine.log_mark) if engine.exit_code != -9 else None
        return (f"engine {what} {describe_exit(engine.exit_code)} ({exits} exit(s) in {CRASH_WINDOW_S:.0f}s)"
                .replace("  ", " ") + (f": {reason}" if reason else ""))

    def _healthy(self, engine: Engine) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{engine.port}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _set(self, engine: Engine, state: str, error: str | None) -> None:
        if (engine.state, engine.error) == (state, error):
            return
        engine.state, engine.error = state, error
        log.info("engine %s: %s%s", engine.spec.key, state, f" ({error})" if error else "")
        self.on_change()

    def _stop_unwanted(self) -> None:
        now = time.monotonic()
        unwanted = [k for k in self.engines if k not in self.wanted]
        self.unwanted_since = {k: t for k, t in self.unwanted_since.items() if k in unwanted}
        if any(self.engines[k].state == "starting" for k in self.wanted if k in self.engines):
            return
        for key in unwanted:
            if now - self.unwanted_since.setdefault(key, now) >= UNLOAD_GRACE_S:
                self._stop(key)

    def _stop(self, key: str) -> None:
        engine = self.engines.pop(key)
        self.unwanted_since.pop(key, None)
        self.memory.forget(key)
        engine.supervisor.stop_all(timeout=15.0)
        self._after_death(engine)
        log.info("stopped engine %s", key)
        self.on_change()

    # --- what others read ---------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """``GET /engines``: the engines of deployed versions (stopping ones are left out)."""
        with self.lock:
            return {"engines": {k: e.view() for k, e in self.engines.items() if k in self.wanted}}

    def readiness(self) -> dict[str, Any]:
        with self.lock:
            return {"revision": self.revision,
                    "failures": {k: e.error or "failed" for k, e in self.engines.items()
                                 if k in self.wanted and e.state == "failed"}}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for key in list(self.engines):
                self._stop(key)
