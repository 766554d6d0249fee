"""Whether this launcher acts on the cluster: with two control planes, only the leader's does.

The launcher runs beside its control plane in one pod (the chart's ``llm-launcher`` sidecar). Both
launchers read the engines' pods and answer the workers; only the one whose control plane leads
(registry/leadership.py, ``GET /leadership`` on 127.0.0.1) creates, replaces, deletes and puts engines
to sleep, so no change is made twice and no engine is put to sleep by one while the other wakes it.
A control plane that does not answer is not leading, as far as this launcher knows.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import httpx

log = logging.getLogger(__name__)

ASK_EVERY_S = 1.0


class LeaderCheck:
    def __init__(self, url: str, get: Callable[[str], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self.clock = url, clock
        self._get = get or self._ask
        self._asked_at, self._leads = float("-inf"), False

    def __call__(self) -> bool:
        if self.clock() - self._asked_at >= ASK_EVERY_S:
            self._asked_at = self.clock()
            leads = self._get(self.url)
            if leads != self._leads:
                log.info("this launcher %s", "acts: its control plane leads" if leads
                         else "only reads: its control plane does not lead")
            self._leads = leads
        return self._leads

    @staticmethod
    def _ask(url: str) -> bool:
        try:
            return bool(httpx.get(url, timeout=2.0).json().get("leader"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
