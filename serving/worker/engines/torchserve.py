"""Engine ``torchserve``: a TorchServe archive's handler serves the version, as TorchServe runs it.

A ``"python"`` engine: the data plane hands it the request as the endpoint's processor passed it
(preprocess/handler.py: a :class:`HandlerRequest` from ``/predictions``, or ``/serve``'s JSON as
TorchServe's ``body`` parameter), and it answers with the handler's :class:`HandlerAnswer`. The
archive is unpacked once per content hash; each version gets its handler processes and batching
(serving/torchserve/handler_pool.py), started when a config is applied, so a version is ready
only once its handler has initialized. A handler's error answer becomes a :class:`HandlerError`
carrying the handler's status, so each front end reports it in its own shape.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from preprocess.requirements import install_once
from serving.torchserve.archive import ArchiveError, ArchiveInfo, read_archive, requirements, unpack
from serving.torchserve.codec import HandlerAnswer, HandlerRequest
from serving.torchserve.handler_pool import HandlerPool, PoolSpec
from serving.torchserve.options import effective
from serving.worker.errors import ModelNotReady, ServingError
from serving.worker.runtime import Target

log = logging.getLogger(__name__)


class HandlerError(ServingError):
    """The handler's answer was an error: its status, TorchServe's exception name, its message."""

    def __init__(self, answer: HandlerAnswer) -> None:
        super().__init__(answer.message or f"the handler answered {answer.status}")
        self.status = answer.status
        self.error_type = answer.error_type or ("BadRequestException" if answer.status < 500
                                                else "InternalServerException")


class TorchServeEngine:
    kind = "python"

    def __init__(self, artifact_path: Callable[[str], Path], root: Path, per_model_installs: bool = False) -> None:
        self.artifact_path = artifact_path
        self.root = root  # unpacked archives, handler logs, per-model packages
        self.per_model_installs = per_model_installs  # SERVING_INSTALL_PY_DEP_PER_MODEL
        self._pools: dict[tuple[str, str], HandlerPool] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(target: Target) -> tuple[str, str]:
        """One pool per archive and set of options: a version redeployed with other options restarts."""
        return target.artifact, repr(sorted(target.engine_options.items()))

    def prepare(self, target: Target) -> None:
        key = self._key(target)
        with self._lock:
            if key in self._pools:
                return
        pool = HandlerPool(self._spec(target))
        pool.start()  # blocks until every handler process has initialized (HandlerFailedToLoad otherwise)
        with self._lock:
            if key in self._pools:  # another config thread won the race
                pool.close()
            else:
                self._pools[key] = pool

    def _spec(self, target: Target) -> PoolSpec:
        path = self.artifact_path(target.artifact)
        try:
            info = read_archive(path)
        except ArchiveError as exc:
            raise RuntimeError(f"{target.model}:{target.version} is not a TorchServe archive: {exc}") from None
        model_dir = unpack(path, self.root / "archives")
        packages = self._packages(target, path, info)
        values = effective(info, target.engine_options)
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return PoolSpec(model_name=target.model, model_dir=model_dir, info=info, batch_size=values["batch_size"],
                        max_batch_delay_ms=values["max_batch_delay"], response_timeout_s=values["response_timeout"],
                        workers=values["workers"], threads=values["threads"], runtime=values["runtime"],
                        packages=packages,
                        log_path=logs / f"{target.model}-v{target.version}-{target.artifact[:12]}.log")

    def _packages(self, target: Target, path: Path, info: ArchiveInfo) -> Path | None:
        """The archive's requirements.txt, installed once per set where the operator allows it (TorchServe's
        install_py_dep_per_model); the control plane refuses such an archive otherwise."""
        wanted = requirements(path, info)
        if not wanted:
            return None
        if not self.per_model_installs:
            raise RuntimeError(f"{target.model}:{target.version} needs {', '.join(wanted)} (its requirements.txt) and "
                               "per-model installs are off on this worker (SERVING_INSTALL_PY_DEP_PER_MODEL)")
        return install_once(wanted, self.root / "packages")

    def retain(self, targets: Iterable[Target]) -> None:
        keep = {self._key(t) for t in targets}
        with self._lock:
            gone = [key for key in self._pools if key not in keep]
            closing = [self._pools.pop(key) for key in gone]
        for pool in closing:
            pool.close()

    async def run(self, target: Target, processor: Any, data: Any, state: dict, collect: Any) -> HandlerAnswer:
        pool = self._pools.get(self._key(target))
        if pool is None:
            raise ModelNotReady(f"model {target.model}:{target.version} is still loading")
        if not isinstance(data, HandlerRequest):
            raise TypeError("engine torchserve takes a HandlerRequest (preprocess/handler.py)")
        answer, timings = await pool.submit(data)
        state.setdefault("event", {})["torchserve"] = timings  # in the statistics event: ts_* metrics, batch size
        if not answer.ok:
            raise HandlerError(answer)
        return answer

    async def ready(self, target: Target) -> bool:
        return self._key(target) in self._pools

    async def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def create(settings: Any, artifact_path: Callable[[str], Path]) -> TorchServeEngine:
    return TorchServeEngine(artifact_path, Path(settings.home) / "torchserve",
                            bool(getattr(settings, "install_py_dep_per_model", False)))

