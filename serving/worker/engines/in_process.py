"""Engines that run a framework's model object inside the worker, on whatever ``preprocess`` returned.

This is how ClearML Serving runs scikit-learn, XGBoost and LightGBM models, and what
their users' ``preprocess.py`` files expect: ``process`` gets the preprocess output
as is (a list, a numpy array, an ``xgboost.DMatrix``), not tensors matched to a
signature. The framework is imported only when a model of it is loaded, so the
worker needs the library (``pip install serving[sklearn]`` ...) only if it serves one.
Models load when a config is applied (never on a request) and predictions run on a
thread pool so the event loop keeps accepting requests.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from preprocess.base import Collect, PreprocessError
from serving.worker.errors import ModelNotReady, brief
from serving.worker.runtime import Target


class InProcessEngine:
    kind = "python"  # the data plane hands it preprocess output, not tensors
    extra = ""  # the package extra that installs the framework

    def __init__(self, artifact_path: Callable[[str], Path], threads: int = 4) -> None:
        self.artifact_path = artifact_path
        self._models: dict[str, Any] = {}
        self._adopted: set[str] = set()  # artifacts whose model the user's load() returned
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=type(self).__name__)

    # --- what a framework module provides ------------------------------------------
    def load(self, path: Path) -> Any:
        raise NotImplementedError

    def predict(self, model: Any, data: Any) -> Any:
        return model.predict(data)

    # --- engine interface -----------------------------------------------------------
    def prepare(self, target: Target) -> None:
        if not target.artifact:
            return
        with self._lock:
            if target.artifact not in self._models:
                try:
                    self._models[target.artifact] = self.load(self.artifact_path(target.artifact))
                except ImportError as exc:
                    raise RuntimeError(f"{exc}: install the worker with `pip install serving[{self.extra}]`") from exc

    def adopt(self, target: Target) -> None:
        """``Preprocess.load`` returned the model: ``run`` uses the processor's, the file is not loaded."""
        with self._lock:
            self._adopted.add(target.artifact)

    def retain(self, targets: Iterable[Target]) -> None:
        keep = {t.artifact for t in targets}
        with self._lock:
            for artifact in set(self._models) - keep:
                del self._models[artifact]
            self._adopted &= keep

    async def run(self, target: Target, processor: Any, data: Any, state: dict, collect: Collect) -> Any:
        """``Preprocess.load`` may have returned the model object; ClearML uses it instead of the file."""
        model = getattr(processor, "loaded", None)
        if model is None:
            model = self._models.get(target.artifact)
        if model is None:
            raise ModelNotReady(f"model {target.model}:{target.version} is still loading")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.predict, model, data)
        except Exception as exc:  # the framework's own errors for input it cannot use
            raise PreprocessError(f"{type(self).__name__.removesuffix('Engine').lower()} model "
                                  f"{target.model}:{target.version} rejected the input: {type(exc).__name__}: {brief(exc)}") from None

    async def ready(self, target: Target) -> bool:
        return not target.artifact or target.artifact in self._models or target.artifact in self._adopted

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
