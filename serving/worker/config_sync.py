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
from serving.config_client import ConfigSubscriber
from serving.worker.engines.base import Engine
from serving.worker.runtime import Config, EndpointRuntime, Target

log = logging.getLogger(__name__)

ENGINES = ("triton", "onnxruntime", "custom")


class ConfigSync:
    def __init__(self, engines: Mapping[str, Engine], artifact_path: Callable[[str], Path], unpack_root: Path,
                 listeners: list[Callable[[dict], None]] | None = None) -> None:
        self.engines = engines
        self.artifact_path = artifact_path
        self.unpack_root = unpack_root
        self.listeners = listeners or []
        self.current = Config()
        self._processors: dict[str, tuple[str, Processor]] = {}
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
            self._processors = {k: v for k, v in self._processors.items() if k in endpoints}
            self.current = Config(int(snapshot.get("revision", 0)), MappingProxyType(endpoints),
                                  MappingProxyType(errors))
        log.info("applied config revision %s (%d endpoints)", self.current.revision, len(endpoints))
        for listener in self.listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("config listener failed")

    def _build(self, spec: dict[str, Any]) -> EndpointRuntime:
        engine = spec.get("engine") or "triton"
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        targets = tuple(Target.from_snapshot(t, spec.get("batching")) for t in spec.get("targets") or ())
        if not targets:
            raise ValueError("the endpoint has no model version")
        if engine in self.engines:
            for target in targets:
                self.engines[engine].prepare(target)
        pre = spec.get("preprocess") or {"kind": "none"}
        return EndpointRuntime(name=spec["name"], engine=engine, targets=targets,
                               processor=self._processor(spec["name"], pre, engine, targets),
                               preprocess_kind=pre.get("kind", "none"))

    def _processor(self, endpoint: str, pre: dict[str, Any], engine: str, targets: tuple[Target, ...]) -> Processor:
        """Reuse the loaded processor while its definition is unchanged (user code keeps its state)."""
        model_file = self.artifact_path(targets[0].artifact) if engine == "custom" and targets[0].artifact else None
        key = json.dumps([pre, engine, str(model_file)], sort_keys=True)
        cached = self._processors.get(endpoint)
        if cached is not None and cached[0] == key:
            return cached[1]
        processor = build_processor(pre, self.artifact_path, self.unpack_root, model_file)
        self._processors[endpoint] = (key, processor)
        return processor
