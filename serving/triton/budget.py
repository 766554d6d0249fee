"""Which embedded-Triton models stay loaded under a memory budget: accounting and LRU choice.

Pure policy, no Triton and no processes: serving/triton/loader.py feeds it what it measured
(each loaded model's resident bytes, read from its Python-backend stub processes) and when each
model was last used (Triton's own statistics), and asks which models to unload so that one more
fits. Costs are measured, never guessed from file sizes: a model's stub holds a Python
interpreter, numpy and onnxruntime besides the weights, and what onnxruntime allocates shows
only once it ran. Before a model was ever measured its cost is estimated from the largest
per-instance cost measured so far (or ``DEFAULT_INSTANCE_BYTES`` before anything was).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

MB = 1024 * 1024
DEFAULT_INSTANCE_BYTES = 120 * MB  # one stub before any was measured (measured here: 83-102 MB RSS)
MAX_GROWTH = 2.0  # a model's growth after loading counts at most this much (a reload, not growth, past it)
IDLE_S = 2.0      # a model used within this many seconds is busy: never unloaded for another
PROTECT_S = 3.0   # a model loaded for a waiting request is kept this long, so the request reaches it

LOADED, COLD, LOADING, FAILED, PENDING = "loaded", "cold", "loading", "failed", "pending"


@dataclass
class ModelUse:
    """One model's place in the budget. Times are wall-clock seconds (Triton reports last use in
    milliseconds since the epoch)."""

    name: str
    state: str = PENDING
    loadable: bool = False     # loaded fine once: a cold model is loaded on demand, not an error
    bytes: int = 0             # resident bytes of its stub processes while loaded (0 when cold)
    instances: int = 0         # Triton instances loaded now
    per_instance: int = 0      # bytes of one instance, largest measured (kept while cold: the next estimate)
    at_load: int = 0           # bytes right after its last load or resize
    last_used: float = 0.0     # last inference Triton saw, or last demand for it
    protected_until: float = 0.0
    running: int = 0           # inferences under way on it now: an in-process engine counts them exactly
    error: str = ""

    def in_memory(self) -> bool:
        return self.state in (LOADED, LOADING)

    def idle(self, now: float, idle_s: float = IDLE_S) -> bool:
        return not self.running and now - self.last_used >= idle_s and now >= self.protected_until

    def as_dict(self) -> dict:
        return {"state": self.state, "loadable": self.loadable, "bytes": self.bytes,
                "instances": self.instances, "last_used": self.last_used, "error": self.error}


class MemoryBudget:
    """Models by name, and the choice of least recently used idle ones to make room."""

    def __init__(self, limit_bytes: int, idle_s: float = IDLE_S) -> None:
        self.limit = int(limit_bytes)
        self.idle_s = idle_s
        self.models: dict[str, ModelUse] = {}
        self.growth = 1.0  # largest ratio of a model's size once it ran to its size when loaded

    def model(self, name: str) -> ModelUse:
        return self.models.setdefault(name, ModelUse(name))

    def forget(self, name: str) -> None:
        self.models.pop(name, None)

    def used(self, exclude: Iterable[str] = ()) -> int:
        skip = set(exclude)
        return sum(m.bytes for m in self.models.values() if m.in_memory() and m.name not in skip)

    def estimate(self, name: str, instances: int) -> int:
        """Bytes ``instances`` instances of ``name`` will hold: its own last measure, else the most
        any model's instance measured, else the default."""
        own = self.models.get(name)
        per = own.per_instance if own and own.per_instance else 0
        if not per:
            per = max((m.per_instance for m in self.models.values()), default=0) or DEFAULT_INSTANCE_BYTES
        return per * max(1, instances)

    def loaded(self, name: str, measured: int) -> None:
        """Just loaded, holding ``measured`` bytes: it is charged what it will hold once it ran, its
        load-time size times the most any model grew by its first requests (onnxruntime allocates
        as it runs: 97.7 -> 102.4 MB measured here), so later growth stays within the budget."""
        m = self.model(name)
        m.at_load = measured
        m.per_instance = max(m.per_instance, int(measured * self.growth) // max(1, m.instances))
        self.record(name, measured)

    def reserve(self, name: str, instances: int) -> None:
        """Room made for a load of ``name``: it is charged its estimate from now on (LOADING), so
        that no other check can count that room as free while it loads."""
        m = self.model(name)
        m.state, m.instances = LOADING, instances
        m.bytes = max(m.bytes, self.estimate(name, instances))

    def record(self, name: str, measured: int) -> None:
        """The model's stubs hold ``measured`` bytes now. It stays charged at least its largest
        measure per instance; 0 (no stub seen) frees its charge only when it is not held: a
        loaded model whose stubs a reading missed still holds its memory."""
        m = self.model(name)
        if not measured:
            m.bytes = self.estimate(name, m.instances) if m.in_memory() else 0
            return
        if m.at_load:
            self.growth = min(MAX_GROWTH, max(self.growth, measured / m.at_load))
        m.per_instance = max(m.per_instance, measured // max(1, m.instances))
        m.bytes = max(measured, m.per_instance * max(1, m.instances))

    def victims(self, need: int, now: float, keep: Iterable[str] = ()) -> list[str] | None:
        """Least recently used idle models to unload so that ``need`` more bytes fit; [] when they
        fit already; None when unloading every idle model would not make room (busy models hold
        the rest, so the caller waits). A model alone larger than the budget is let in once
        nothing else is loaded: it could never be served otherwise."""
        keep = set(keep)
        free = self.limit - self.used(exclude=keep)
        candidates = sorted((m for m in self.models.values()
                             if m.in_memory() and m.name not in keep and m.state != LOADING
                             and m.idle(now, self.idle_s)), key=lambda m: m.last_used)
        chosen: list[str] = []
        for m in candidates:
            if free >= need:
                break
            chosen.append(m.name)
            free += m.bytes
        if free >= need:
            return chosen
        others = [m for m in self.models.values() if m.in_memory() and m.name not in keep]
        if len(chosen) == len(others):  # nothing busy is left: the model is simply larger than the budget
            return chosen
        return None

    def over(self) -> int:
        """Bytes held past the budget (0 when within)."""
        return max(0, self.used() - self.limit)

    def snapshot(self) -> dict:
        return {"budget_bytes": self.limit, "used_bytes": self.used(),
                "models": {n: m.as_dict() for n, m in sorted(self.models.items())}}
