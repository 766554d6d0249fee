"""Run a user's ``preprocess.py`` written for ClearML Serving, unchanged.

The file defines a class ``Preprocess`` with ``preprocess(body, state,
collect_custom_statistics_fn)``, ``postprocess(data, state, collect_custom_statistics_fn)``,
optionally ``process(data, state, collect_custom_statistics_fn)`` (custom engine) and
``load(local_file_name)``; any of them may be ``async``. Synchronous user code runs
in a thread so a slow ``preprocess`` cannot stall the worker's event loop, and any
exception it raises becomes a 422 naming the step, never a traceback to the client.
"""
from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import inspect
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

from preprocess.base import Collect, PreprocessError


class UserCodeError(RuntimeError):
    """The preprocess file cannot be loaded (syntax error, no ``Preprocess`` class, ``load`` failed)."""


def load_module(path: Path) -> Any:
    name = f"serving_user_preprocess_{uuid.uuid4().hex[:12]}"
    # Artifacts are stored under their hash, without a .py suffix: name the loader explicitly.
    spec = importlib.util.spec_from_loader(name, importlib.machinery.SourceFileLoader(name, str(path)))
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path} cannot be loaded as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserCodeError(f"preprocess.py failed to import: {type(exc).__name__}: {exc}") from exc
    return module


class UserProcessor:
    outputs_form = "clearml"

    def __init__(self, path: Path, model_file: Path | None = None) -> None:
        module = load_module(path)
        cls = getattr(module, "Preprocess", None)
        if cls is None:
            raise UserCodeError("preprocess.py defines no class named Preprocess")
        try:
            self.user = cls()
            if model_file is not None and hasattr(self.user, "load"):
                self.user.load(str(model_file))
        except Exception as exc:
            raise UserCodeError(f"Preprocess() or load() failed: {type(exc).__name__}: {exc}") from exc
        self.has_process = callable(getattr(self.user, "process", None))

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> Any:
        return await self._call("preprocess", body, state, collect, missing=body)

    async def process(self, data: Any, state: dict, collect: Collect) -> Any:
        if not self.has_process:
            raise PreprocessError("the custom engine needs Preprocess.process() in preprocess.py")
        return await self._call("process", data, state, collect, missing=data)

    async def postprocess(self, data: Any, state: dict, collect: Collect) -> Any:
        return await self._call("postprocess", data, state, collect, missing=data)

    async def _call(self, step: str, data: Any, state: dict, collect: Collect, missing: Any) -> Any:
        fn: Callable | None = getattr(self.user, step, None)
        if fn is None:
            return missing
        try:
            if inspect.iscoroutinefunction(fn):
                return await fn(data, state, collect)
            return await asyncio.to_thread(fn, data, state, collect)
        except PreprocessError:
            raise
        except Exception as exc:
            raise PreprocessError(f"{step}() in preprocess.py raised {type(exc).__name__}: {exc}") from exc
