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
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from preprocess.base import Processor
from preprocess.loader import build_processor
from preprocess.user_code import UserContext
from serving.config_client import ConfigSubscriber
from serving.worker.engines.base import Engine
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
        self._lock = threading.Lock()
        self._subscriber: ConfigSubscriber | None = None

    def follow(self, control_plane_url: str, cache_path: Path) -> "ConfigSync":
        """Apply the cached snapshot now (if any), then stream new ones in the background."""
        self._subscriber = ConfigSubscriber(control_plane_url, self.apply, cache_path).start()
        return self

    def stop(self) -> None:
        if self._subscriber is not None:
            self._subscriber.stop()

    def apply(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            endpoints: dict[str, EndpointRuntime] = {}
            errors: dict[str, str] = {}
            for name, spec in (snapshot.get("endpoints") or {}).items():
                try:
                    endpoints[name] = self._build(spec)
                except Exception as exc:  # one bad endpoint must not take the others down
                    log.exception("endpoint %s could not be loaded", name)
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    if name in self.current.endpoints:
                        endpoints[name] = self.current.endpoints[name]
            for kind, engine in self.engines.items():
                engine.retain(t for ep in endpoints.values() if ep.engine == kind for t in ep.targets)
            self._retain_processors(endpoints)
            self.current = Config(int(snapshot.get("revision", 0)), MappingProxyType(endpoints),
                                  MappingProxyType(errors))
        log.info("applied config revision %s (%d endpoints)", self.current.revision, len(endpoints))
        for listener in self.listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("config listener failed")

    def _build(self, spec: dict[str, Any]) -> EndpointRuntime:
        name, engine_name = spec["name"], spec.get("engine") or "triton"
        engine = self.engines.get(engine_name)
        if engine is None:
            raise ValueError(f"unknown engine {engine_name!r}; one of {', '.join(self.engines)}")
        targets = tuple(Target.from_snapshot(t, spec.get("batching")) for t in spec.get("targets") or ())
        if not targets:
            if engine_name not in ("custom", "custom_async"):
                raise ValueError("the endpoint has no model version")
            targets = (Target.model_less(name),)
        pre = spec.get("preprocess") or {"kind": "none"}
        io = spec.get("io") or {}
        shared = self._processor(name, None, pre, engine_name, io) if pre.get("kind") != "user" else None
        per_version = {t.version: self._processor(name, t, pre, engine_name, io)
                       for t in targets} if shared is None else {}
        for target in targets:
            # a model object from the user's load() replaces the engine's own loading (ClearML)
            if getattr(per_version.get(target.version), "loaded", None) is None or engine.kind != "python":
                engine.prepare(target)
        return EndpointRuntime(name=name, engine=engine_name, targets=targets,
                               processor=shared or per_version[targets[0].version],
                               preprocess_kind=pre.get("kind", "none"), io=MappingProxyType(io),
                               version_processors=MappingProxyType(per_version))

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
                                  timeout_s=self.user_timeout_s)
        processor = build_processor(pre, self.artifact_path, self.unpack_root, context)
        if cached is not None:
            self._retiring.append(cached[1])
        self._processors[slot] = (key, processor)
        return processor

    def _retain_processors(self, endpoints: Mapping[str, EndpointRuntime]) -> None:
        """Processors the new config no longer uses are closed one revision later: requests that
        read the previous config may still be running their user code."""
        for processor in self._retired:
            _close(processor)
        live = {id(p) for ep in endpoints.values() for p in (ep.processor, *ep.version_processors.values())}
        for slot, (_, processor) in list(self._processors.items()):
            if id(processor) not in live:
                self._retiring.append(processor)
                del self._processors[slot]
        self._retired = [p for p in self._retiring if id(p) not in live]
        self._retiring = []


def _close(processor: Processor) -> None:
    close = getattr(processor, "close", None)
    if callable(close):
        close()


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
