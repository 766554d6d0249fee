"""The engines' memory budget (``SERVING_LLM_MEMORY_BUDGET_MB``): an engine starts only when it fits.

An engine's cost is the resident set of its process tree (the OpenAI server and its EngineCore), read
with psutil: about 3.3 GB for a tiny model on CPU, most of it vLLM and torch themselves, plus the KV
cache (``kv_cache_space_gb``) and the weights. An engine not measured yet is estimated as the largest
measured so far, else ``DEFAULT_ENGINE_MB``. One that does not fit is reported ``failed`` with the
figures, and started as soon as an engine stopped makes room.
"""
from __future__ import annotations

import psutil

MB = 1 << 20
DEFAULT_ENGINE_MB = 3400 + 1024  # measured: 3.3 GB resident for the tiny Llama, plus the default 1 GiB KV cache


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class EngineMemory:
    def __init__(self, budget_mb: int) -> None:
        self.budget = budget_mb * MB
        self.sizes: dict[str, int] = {}  # engine key -> RSS measured when it became ready

    def measured(self, key: str, pid: int) -> None:
        size = tree_rss(pid)
        if size:
            self.sizes[key] = size

    def forget(self, key: str) -> None:
        self.sizes.pop(key, None)

    def estimate(self, key: str) -> int:
        return self.sizes.get(key) or max(self.sizes.values(), default=DEFAULT_ENGINE_MB * MB)

    def refusal(self, key: str, running_pids: list[int]) -> str | None:
        """Why ``key`` may not start now (the budget's figures), or None."""
        if self.budget <= 0:
            return None
        used = sum(tree_rss(pid) for pid in running_pids)
        need = self.estimate(key)
        if used + need <= self.budget:
            return None
        return (f"waiting for memory: the engines' budget is {self.budget // MB} MB (SERVING_LLM_MEMORY_BUDGET_MB), "
                f"{used // MB} MB in use by {len(running_pids)} engine(s), this one needs about {need // MB} MB")
