"""Which in-worker onnxruntime sessions stay open under a memory budget: accounting and LRU choice.

The policy is the embedded Triton's (serving/triton/budget.py: least recently used idle models
make room, a model larger than the whole budget loads alone, costs are measured, not guessed),
keyed here by artifact instead of Triton model name. What differs in-process:

* an inference under way is counted exactly (``ModelUse.running``), and closing a session is
  instant, so the recency guard is short (``IDLE_S``): Triton's 2 s makes up for last-use
  statistics that lag and for a stub's slow exit; here it would only make a cold request wait.
* a session's cost is the growth of this process's resident set (RSS) across opening it plus
  across its first run, with freed heap given back to the system first (``release_freed``).
  Before anything was measured, and as a floor, it is the ONNX file's size (onnxruntime holds
  every initializer in memory). Each session is charged its own first run, not the largest growth
  any model showed (as Triton's budget must, measuring only at load): one noisy run would
  otherwise inflate every session.
* a process-wide measure is noisy: other threads allocate meanwhile, and the allocator keeps some
  freed heap (an 8 MB model read 16.1 MB on about one open in eight here, and sometimes 0 when it
  reused a closed session's pages). So a session costs the median of its last ``RECENT`` measures,
  never less than its file: one odd reading does not halve what the budget holds for as long as
  the model stays deployed.

No onnxruntime and no threads here: serving/worker/engines/onnxruntime_budget.py (the sessions the
worker's onnxruntime engine holds under the budget) feeds it and holds the lock around it; every
choice of which sessions stay open is made here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections import deque
from functools import lru_cache
from typing import Any

from serving.triton.budget import COLD, FAILED, LOADED, LOADING, MB, MemoryBudget, ModelUse

IDLE_S = 0.25  # a session used this recently stays open while an idle-longer one can make room
RECENT = 3     # measures of a session's opens its cost is the median of (the higher one of two)

__all__ = ["IDLE_S", "MB", "SessionBudget", "release_freed", "resident_bytes"]


def resident_bytes() -> int:
    """This process's resident set in bytes (psutil, else /proc/self/statm; 0 when neither)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@lru_cache(maxsize=1)
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def release_freed() -> None:
    """Give freed heap pages back to the system (glibc ``malloc_trim``; a no-op elsewhere). Without
    it a closed session's memory stays in this process's heap: the budget would free nothing the
    machine can use, and the next session's RSS growth would read as zero (measured: 8 MB sessions
    closed, 0 MB returned until trimmed, 24 of 32 MB after; a trim takes about 2 ms)."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


class SessionBudget(MemoryBudget):
    """Sessions by artifact: which are loadable, which are open, what each costs, which to close."""

    def __init__(self, limit_bytes: int, idle_s: float = IDLE_S) -> None:
        super().__init__(limit_bytes, idle_s)
        self.files: dict[str, int] = {}  # artifact -> its file's size: the floor of any measure
        self.measures: dict[str, deque[int]] = {}  # artifact -> its last opens' measures

    def admit(self, artifact: str, file_bytes: int) -> None:
        """About to be checked: its file size is its cost until a measure says more."""
        m = self.model(artifact)
        self.files[artifact] = int(file_bytes)
        m.per_instance = max(m.per_instance, int(file_bytes))

    def forget(self, name: str) -> None:
        super().forget(name)
        self.files.pop(name, None)
        self.measures.pop(name, None)

    def failed(self, artifact: str, error: str) -> None:
        m = self.model(artifact)
        m.state, m.loadable, m.error, m.bytes = FAILED, False, error[:500], 0

    def cost(self, artifact: str) -> int:
        """Bytes the session holds once open: its largest measure, at least its file size."""
        return self.estimate(artifact, 1)

    def fits(self, artifact: str) -> bool:
        """Opening it needs no other session closed."""
        return self.used(exclude={artifact}) + self.cost(artifact) <= self.limit

    def reserve(self, artifact: str) -> None:
        """Room made for it: charged its cost while it opens, so nothing else takes the room."""
        m = self.model(artifact)
        m.state, m.bytes = LOADING, self.cost(artifact)

    def unreserve(self, artifact: str) -> None:
        """Its open failed: the room it held is free again."""
        m = self.model(artifact)
        if m.state == LOADING:
            m.state, m.bytes = COLD, 0

    def opened(self, artifact: str, measured: int, now: float) -> None:
        """Open, its RSS growth ``measured``; ``now``: when it counts as last used (0 for an open
        at admission, which no request asked for)."""
        m = self.model(artifact)
        m.state, m.instances, m.loadable, m.error = LOADED, 1, True, ""
        self.measures.setdefault(artifact, deque(maxlen=RECENT)).append(max(int(measured), self.files.get(artifact, 0)))
        self._charge(m)
        m.last_used = max(m.last_used, now)

    def admitted(self, artifact: str, measured: int) -> bool:
        """Opened at deploy to check it, its RSS growth ``measured``: whether it stays open. It
        stays while it fits beside the open ones (counted as opened for no request, so first to
        go); else it is closed again and stays cold, loadable on its first request."""
        self.opened(artifact, measured, now=0.0)
        if not self.over():
            return True
        self.closed(artifact)
        return False

    def _charge(self, m: ModelUse) -> None:
        recent = sorted(self.measures[m.name])
        m.per_instance = recent[len(recent) // 2]
        if m.state == LOADED:
            m.bytes = m.per_instance

    def refit(self, artifact: str, now: float) -> list[str]:
        """Just opened and measured above its estimate, past the budget: the idle sessions to close
        so that it fits again (none while busy ones hold the room: the next load makes up for it)."""
        if not self.over():
            return []
        return self.victims(self.model(artifact).bytes, now, keep={artifact}) or []

    def ran_first(self, artifact: str, grew: int) -> None:
        """Its first run grew RSS by ``grew`` bytes (onnxruntime allocates as it runs)."""
        m = self.models.get(artifact)
        if m is not None and m.state == LOADED and self.measures.get(artifact):
            self.measures[artifact][-1] += max(0, int(grew))
            self._charge(m)

    def closed(self, artifact: str) -> int:
        """Closed (evicted, or opened only to check it): returns the bytes it was charged."""
        m = self.model(artifact)
        held, m.bytes, m.instances = m.bytes, 0, 0
        if m.state == LOADED:
            m.state = COLD
        return held

    def begin(self, artifact: str, now: float) -> None:
        m = self.models.get(artifact)
        if m is not None:
            m.running += 1
            m.last_used = now

    def end(self, artifact: str, now: float) -> None:
        m = self.models.get(artifact)
        if m is not None:
            m.running = max(0, m.running - 1)
            m.last_used = now

    def room_for(self, artifact: str, now: float) -> list[str] | None:
        """Open sessions to close, least recently used first, so that ``artifact`` fits; None while
        busy ones hold the room (the caller waits)."""
        return self.victims(self.cost(artifact), now, keep={artifact})

    def running(self) -> int:
        """Inferences under way on all sessions."""
        return sum(m.running for m in self.models.values())

    def loadable(self, artifact: str) -> bool:
        m = self.models.get(artifact)
        return m is not None and m.loadable

    def held(self) -> tuple[int, int]:
        """(open sessions, bytes they are charged)."""
        return sum(m.state == LOADED for m in self.models.values()), self.used()
