"""Each LLM engine's own signals, for the HPA the launcher gives each engine on Kubernetes (serving/llm/kube/).

An engine made by the control plane is a Deployment with a headless Service of the same name. Its HPA asks
for the LLM signals (catalogue.py) with a metric selector ``serving.io/engine=<name>``; the first such ask
starts reading that Service's pods, so an engine's signals exist while something asks for them and stop
``IDLE_S`` after the last ask (its engine deleted). The first ask has no sample yet: the API answers 503,
and the HPA keeps the scale until the next sync.
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from registry.autoscaling.catalogue import Signals, signals
from registry.autoscaling.signals import Signal

LABEL = "serving.io/engine"
_SELECTOR = re.compile(rf"^{re.escape(LABEL)}=([a-z]([-a-z0-9]{{0,61}}[a-z0-9])?)$")
IDLE_S = 300.0


@dataclass
class _Engine:
    served: Signals
    task: asyncio.Task
    used: float


class EngineSignals:
    def __init__(self, port: int, idle_s: float = IDLE_S) -> None:
        self.port, self.idle_s = port, idle_s
        self.metrics = frozenset(s.name for s in signals(llm="engine:1").signals)
        self._engines: dict[str, _Engine] = {}

    def get(self, metric: str, selector: str) -> Signal | None:
        """``metric`` of the engine ``selector`` names (ValueError: the selector names none); call it on the
        event loop (it starts the engine's sampling there)."""
        match = _SELECTOR.match(selector.strip())
        if match is None:
            raise ValueError(f"{metric} is read per LLM engine: the selector must be {LABEL}=<engine>, not {selector!r}")
        name, now = match.group(1), time.monotonic()
        self._forget_idle(now)
        engine = self._engines.get(name)
        if engine is None:
            served = signals(llm=f"{name}:{self.port}")
            task = asyncio.get_running_loop().create_task(served.scrapes[0].run())
            engine = self._engines[name] = _Engine(served, task, now)
        engine.used = now
        return next((s for s in engine.served.signals if s.name == metric), None)

    def _forget_idle(self, now: float) -> None:
        for name in [n for n, e in self._engines.items() if now - e.used > self.idle_s]:
            self._engines.pop(name).task.cancel()

    def close(self) -> None:
        for engine in self._engines.values():
            engine.task.cancel()
        self._engines.clear()
