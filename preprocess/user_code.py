"""Run a user's ``preprocess.py`` written for ClearML Serving, unchanged.

The file defines a class ``Preprocess`` with ``preprocess(body, state,
collect_custom_statistics_fn)``, ``postprocess(data, state, collect_custom_statistics_fn)``,
optionally ``process(data, state, collect_custom_statistics_fn)`` (custom engines) and
``load(local_file_name)``; any of them may be ``async``. As in ClearML Serving,
``model_endpoint`` and ``send_request`` are set on the instance before ``load`` runs,
and what ``load`` returns is kept as the model (``loaded``) for in-process engines.

Synchronous user code runs on the processor's own threads, so a slow endpoint
cannot starve another one's, and past its deadline the client gets a 504; any
exception it raises becomes a 422 naming the step, never a traceback to the client.
"""
from __future__ import annotations

import asyncio
import functools
import importlib.machinery
import importlib.util
import inspect
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from preprocess.base import Collect, PreprocessError, UserCodeTimeout


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


@dataclass
class UserContext:
    """What the worker hands user code besides the file: ClearML Serving's runtime hooks."""

    model_file: Path | None = None
    endpoint: dict[str, Any] = field(default_factory=dict)  # becomes ``self.model_endpoint``
    send_request: Callable[..., Any] | None = None  # replaces ``Preprocess.send_request``
    timeout_s: float = 60.0  # deadline of one call into user code
    threads: int = 8  # this processor's own threads
    # False where the engine runs the model elsewhere (vllm): ClearML's vllm ``load`` configures an
    # engine inside the serving process, which must not be built here; preprocess/postprocess still run
    call_load: bool = True


STEPS = ("preprocess", "process", "postprocess")
STAGES = ("preprocess", "inference", "postprocess")  # the statistics' stage names


class UserProcessor:
    outputs_form = "clearml"

    def __init__(self, path: Path, context: UserContext | None = None) -> None:
        context = context or UserContext()
        self.timeout_s = context.timeout_s
        self._executor = ThreadPoolExecutor(max_workers=max(1, context.threads), thread_name_prefix="user-code")
        module = load_module(path)
        cls = getattr(module, "Preprocess", None)
        if cls is None:
            raise UserCodeError("preprocess.py defines no class named Preprocess")
        try:
            self.user = cls()
            self.user.model_endpoint = SimpleNamespace(**context.endpoint)
            if context.send_request is not None:
                self.user.send_request = context.send_request
            load = getattr(self.user, "load", None)
            model_file = str(context.model_file) if context.model_file is not None else None
            self.loaded = load(model_file) if callable(load) and context.call_load else None
        except Exception as exc:
            raise UserCodeError(f"Preprocess() or load() failed: {type(exc).__name__}: {exc}") from exc
        self.has_process = callable(getattr(self.user, "process", None))
        steps = [getattr(self.user, step, None) for step in STEPS]
        # One thread hop for the three steps when none is a coroutine (run_steps)
        self.one_hop = self.has_process and not any(inspect.iscoroutinefunction(fn) for fn in steps if fn)

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
                call = fn(data, state, collect)
            else:
                loop = asyncio.get_running_loop()
                call = loop.run_in_executor(self._executor, functools.partial(fn, data, state, collect))
            return await asyncio.wait_for(call, self.timeout_s)
        except PreprocessError:
            raise
        except asyncio.TimeoutError:
            raise UserCodeTimeout(f"{step}() in preprocess.py did not finish within {self.timeout_s:g} s") from None
        except Exception as exc:
            raise PreprocessError(f"{step}() in preprocess.py raised {type(exc).__name__}: {exc}") from exc

    async def run_steps(self, body: Any, state: dict, collect: Collect, mark: Callable[[str], None]) -> Any:
        """preprocess -> process -> postprocess of a ``custom`` endpoint in one call on this
        processor's threads, not three: each hop is a queue put, a thread wake-up and a wake-up of
        the loop, most of what an echo endpoint costs (docs/benchmarks.md, W0). The same contract
        as three ``_call``s: each step has its own deadline (a 504 names the step past it), its
        exceptions become a 422 naming it, ``mark(stage)`` records each stage's time."""
        loop = asyncio.get_running_loop()
        running = [("preprocess", time.monotonic())]  # replaced whole by the thread: one atomic store

        def work() -> Any:
            value = body
            for step, stage in zip(STEPS, STAGES):
                fn = getattr(self.user, step, None)
                if fn is not None:
                    running[0] = (step, time.monotonic())
                    try:
                        value = fn(value, state, collect)
                    except PreprocessError:
                        raise
                    except Exception as exc:
                        raise PreprocessError(f"{step}() in preprocess.py raised {type(exc).__name__}: {exc}") from exc
                mark(stage)
            return value

        future = loop.run_in_executor(self._executor, work)
        late: list[str] = []

        def watch() -> None:  # past the running step's own deadline: give up on it, as wait_for does
            if future.done():
                return
            step, started = running[0]
            left = started + self.timeout_s - time.monotonic()
            if left > 0:
                timer[0] = loop.call_later(left, watch)
            else:
                late.append(step)
                future.cancel()

        timer = [loop.call_later(self.timeout_s, watch)]
        try:
            return await future
        except asyncio.CancelledError:
            if late:
                raise UserCodeTimeout(f"{late[0]}() in preprocess.py did not finish within {self.timeout_s:g} s") from None
            raise
        finally:
            timer[0].cancel()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
