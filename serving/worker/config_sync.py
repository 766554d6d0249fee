"""Follow the control plane and turn each snapshot into a ready-to-serve :class:`Config`.

Everything slow (fetching artifacts, unpacking tokenizers, importing a user's
``preprocess.py``, loading onnxruntime sessions) happens here, in the subscriber's
thread, before the new config is swapped in; requests never wait for it. An
endpoint that fails to build keeps serving its previous definition, and the
failure shows in ``/status`` instead of taking the other endpoints down.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from preprocess.base import Processor
from preprocess.loader import build_processor
from preprocess.user_code import UserContext
from serving.config_client import ConfigSubscriber
from serving.prediction_log import policy as prediction_log
from serving.worker.engines.base import Engine
from serving.worker.gate import LoadOutcomes, Pending, ReadinessGate, TargetLoadError, decide, endpoint_state, label
from serving.worker.runtime import Config, EndpointRuntime, Target

log = logging.getLogger(__name__)


class ConfigSync:
    def __init__(self, engines: Mapping[str, Engine], artifact_path: Callable[[str], Path], unpack_root: Path,
                 listeners: list[Callable[[dict], None]] | None = None, sender: Any = None,
                 user_timeout_s: float = 60.0) -> None:
        self.engines = engines
        self.sender = sender  # serving.worker.pipeline.RequestSender: user code's send_request
        self.user_timeout_s = user_timeout_s
        self.artifact_path = artifact_path
        self.unpack_root = unpack_root
        self.listeners = listeners or []
        self.current = Config()
        self._processors: dict[tuple[str, int | None], tuple[str, Processor]] = {}
        self._retiring: list[Processor] = []  # replaced during this apply
        self._retired: list[Processor] = []  # replaced by the previous apply: closed on the next
        self._closing: list[Processor] = []  # due to close once the lock is released (user code's unload)
        self._lock = threading.Lock()
        self._subscriber: ConfigSubscriber | None = None
        self.gate = ReadinessGate(engines)
        self.pending: dict[str, Pending] = {}  # endpoint -> definition waiting for its targets
        self.watchers: list[Callable[[], None]] = []  # told after each change of what is routed (reports)
        self.recorder: Any = None  # where load outcomes go (the app gives it the data plane's recorder)
        self.outcomes = LoadOutcomes(lambda: self.recorder)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._gate_thread: threading.Thread | None = None

    def follow(self, control_plane_url: str, cache_path: Path) -> "ConfigSync":
        """Apply the cached snapshot now (if any), then stream new ones in the background."""
        self._subscriber = ConfigSubscriber(control_plane_url, self.apply, cache_path).start()
        return self

    def stop(self) -> None:
        if self._subscriber is not None:
            self._subscriber.stop()
        self._stopped.set()
        self._wake.set()

    def close_processors(self) -> None:
        """The worker is shutting down: retire every processor still held (user code's ``unload``).
        Blocking: the app runs it off the event loop, after ``stop``."""
        with self._lock:
            held = [p for _, p in self._processors.values()]
            self._closing += [*self._retired, *self._retiring, *held]
            self._processors, self._retired, self._retiring = {}, [], []
        self._close_due()

    def _close_due(self) -> None:
        """Close what was retired, outside the lock: a slow ``unload`` holds no config change up."""
        with self._lock:
            due, self._closing = self._closing, []
        done: set[int] = set()
        for processor in due:
            if id(processor) not in done:
                done.add(id(processor))
                _close(processor)

    def apply(self, snapshot: dict[str, Any]) -> None:
        revision = int(snapshot.get("revision", 0))
        with self._lock:
            built: dict[str, EndpointRuntime] = {}
            errors: dict[str, str] = {}
            failed_loads: dict[str, tuple[str, TargetLoadError]] = {}
            for name, spec in (snapshot.get("endpoints") or {}).items():
                try:
                    built[name] = self._build(spec)
                except Exception as exc:  # one bad endpoint must not take the others down
                    log.exception("endpoint %s could not be loaded", name)
                    errors[name] = str(exc) if isinstance(exc, TargetLoadError) else f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, TargetLoadError):
                        failed_loads[name] = (spec.get("engine") or "triton", exc)
            self.outcomes.attempted(failed_loads)
            endpoints, self.pending = decide(self.gate, built, self.current.endpoints, revision)
            for name in errors:
                if name in self.current.endpoints:
                    endpoints[name] = self.current.endpoints[name]
            self._retain(endpoints)
            self.current = Config(revision, MappingProxyType(endpoints), MappingProxyType(errors))
        self._close_due()
        held = [n for n, p in self.pending.items() if not p.installed]
        log.info("applied config revision %s (%d endpoints%s)", revision, len(endpoints),
                 f"; previous routes kept until ready: {', '.join(held)}" if held else "")
        for listener in self.listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("config listener failed")
        if self.pending:
            self._start_gate()
        self._changed()

    # --- readiness gate -------------------------------------------------------------
    def readiness(self) -> dict[str, Any]:
        """This process's readiness report: the applied revision and each endpoint's state."""
        with self._lock:
            config, pending = self.current, dict(self.pending)
        names = set(config.endpoints) | set(config.errors)
        return {"revision": config.revision,
                "endpoints": {n: endpoint_state(config.endpoints.get(n), pending.get(n), config.errors.get(n))
                              for n in sorted(names)}}

    def _retain(self, endpoints: Mapping[str, EndpointRuntime]) -> None:
        """Keep what the routed and the waiting definitions use; drop the rest (lock held)."""
        used = [*endpoints.values(), *(p.runtime for p in self.pending.values())]
        for kind, engine in self.engines.items():
            engine.retain(t for ep in used if ep.engine == kind for t in ep.targets)
        self.gate.retain(used)
        self._retain_processors(used)

    def _start_gate(self) -> None:
        self._wake.set()
        if self._gate_thread is None or not self._gate_thread.is_alive():
            self._gate_thread = threading.Thread(target=self._watch_pending, name="readiness-gate", daemon=True)
            self._gate_thread.start()

    def _watch_pending(self) -> None:
        """Re-check waiting endpoints until each is ready, then route to it."""
        while not self._stopped.is_set():
            self._wake.clear()
            with self._lock:
                pending = dict(self.pending)
            for name, entry in pending.items():
                waiting = self.gate.unready(entry.runtime)  # engine calls: outside the lock
                if waiting:
                    entry.waiting = tuple(label(t) for t in waiting)
                else:
                    self._switch(name, entry)
            if pending:
                self._wake.wait(min(p.recheck_s() for p in pending.values()))
            else:
                self._wake.wait()

    def _switch(self, name: str, entry: Pending) -> None:
        with self._lock:
            if self.pending.get(name) is not entry:  # a newer config replaced it meanwhile
                return
            del self.pending[name]
            if not entry.installed:
                endpoints = {**self.current.endpoints, name: entry.runtime}
                self.current = replace(self.current, endpoints=MappingProxyType(endpoints))
                self._retain(endpoints)
        self._close_due()
        log.info("endpoint %s: new targets ready after %.2fs; %s", name, entry.age_s(),
                 "answering" if entry.installed else "switched to them")
        self._changed()

    def _changed(self) -> None:
        with self._lock:
            self.outcomes.routed(self.current.endpoints, self.pending)
        for watcher in self.watchers:
            try:
                watcher()
            except Exception:
                log.exception("readiness watcher failed")

    def _build(self, spec: dict[str, Any]) -> EndpointRuntime:
        name, engine_name = spec["name"], spec.get("engine") or "triton"
        engine = self.engines.get(engine_name)
        if engine is None:
            raise ValueError(f"unknown engine {engine_name!r}; one of {', '.join(self.engines)}")
        targets = tuple(Target.from_snapshot(t, spec.get("batching"), spec.get("engine_options"))
                        for t in spec.get("targets") or ())
        if not targets:
            if engine_name not in ("custom", "custom_async"):
                raise ValueError("the endpoint has no model version")
            targets = (Target.model_less(name),)
        pre = spec.get("preprocess") or {"kind": "none"}
        io = spec.get("io") or {}
        try:
            shared = self._processor(name, None, pre, engine_name, io) if pre.get("kind") != "user" else None
        except Exception as exc:
            raise TargetLoadError(exc, "preprocess", targets) from exc
        per_version = {}
        for target in targets if shared is None else ():
            try:
                per_version[target.version] = self._processor(name, target, pre, engine_name, io)
            except Exception as exc:
                raise TargetLoadError(exc, "preprocess", (target,)) from exc
        for target in targets:
            # a model object from the user's load() replaces the engine's own loading (ClearML): the
            # engine adopts it, so it is ready (v2 /ready, the gate) exactly when it can answer
            from_load = getattr(per_version.get(target.version), "loaded", None) is not None
            adopt = getattr(engine, "adopt", None) if from_load else None
            try:
                adopt(target) if callable(adopt) else engine.prepare(target)
            except Exception as exc:
                raise TargetLoadError(exc, "model", (target,)) from exc
        return EndpointRuntime(name=name, engine=engine_name, targets=targets,
                               processor=shared or per_version[targets[0].version],
                               preprocess_kind=pre.get("kind", "none"), io=MappingProxyType(io),
                               version_processors=MappingProxyType(per_version),
                               prediction_log=prediction_log.from_snapshot(spec.get("prediction_log")))

    def _processor(self, endpoint: str, target: Target | None, pre: dict[str, Any], engine: str,
                   io: dict) -> Processor:
        """Reuse the loaded processor while its definition is unchanged (user code keeps its state).
        ``target``: user code is built per model version; other processors are shared (None)."""
        model_file = self.artifact_path(target.artifact) if target is not None and target.artifact else None
        slot = (endpoint, target.version if target is not None else None)
        key = json.dumps([pre, engine, str(model_file), io], sort_keys=True)
        cached = self._processors.get(slot)
        if cached is not None and cached[0] == key:
            return cached[1]
        context = None
        if pre.get("kind") == "user":
            context = UserContext(model_file=model_file, endpoint=_model_endpoint(endpoint, engine, target, pre, io),
                                  send_request=self.sender.for_engine(engine) if self.sender else None,
                                  timeout_s=self.user_timeout_s,
                                  call_load=getattr(self.engines.get(engine), "calls_user_load", True))
        processor = build_processor(pre, self.artifact_path, self.unpack_root, context)
        if cached is not None:
            self._retiring.append(cached[1])
        self._processors[slot] = (key, processor)
        return processor

    def _retain_processors(self, endpoints: list[EndpointRuntime]) -> None:
        """Processors the new config no longer uses are closed one revision later: requests that
        read the previous config may still be running their user code."""
        self._closing += self._retired
        live = {id(p) for ep in endpoints for p in (ep.processor, *ep.version_processors.values())}
        for slot, (_, processor) in list(self._processors.items()):
            if id(processor) not in live:
                self._retiring.append(processor)
                del self._processors[slot]
        self._retired = [p for p in self._retiring if id(p) not in live]
        self._retiring = []


def _close(processor: Processor) -> None:
    close = getattr(processor, "close", None)
    try:
        if callable(close):
            close()
    except Exception:  # retiring one processor must never crash the worker
        log.exception("closing a retired preprocessor failed")


def _model_endpoint(endpoint: str, engine: str, target: Target | None, pre: dict, io: dict) -> dict[str, Any]:
    """ClearML Serving's ``ModelEndpoint`` fields, which user code may read as ``self.model_endpoint``."""
    inputs, outputs = io.get("inputs") or [], io.get("outputs") or []
    return {"engine_type": engine, "serving_url": endpoint, "model_id": None if target is None or not target.artifact
            else f"{target.model}:{target.version}", "version": None if target is None else str(target.version),
            "preprocess_artifact": pre.get("artifact"),
            "input_name": [t["name"] for t in inputs] or None, "input_type": [t["dtype"] for t in inputs] or None,
            "input_size": [t["shape"] for t in inputs] or None,
            "output_name": [t["name"] for t in outputs] or None, "output_type": [t["dtype"] for t in outputs] or None,
            "output_size": [t["shape"] for t in outputs] or None, "auxiliary_cfg": None}
