"""Where the suite's CPU goes, per test module (``SERVING_TEST_CPU_LOG=path make test``).

On the 2-core machines the suite runs on, every core is busy for the whole run, so its wall time is
its CPU time over two: a module is as expensive as the CPU it and the processes it starts use, not as
its JUnit duration (which mostly measures how long it waited for the other modules). Each pytest
process adds, per test, the CPU of itself, of its live descendants and of the ones they reaped; one
JSON file a process, summed by ``python -m tests.support.cputime path``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

ENV = "SERVING_TEST_CPU_LOG"


def tree_cpu() -> float:
    """Seconds of CPU used by this process and everything under it so far (reaped or alive)."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuLog:
    """A pytest plugin: CPU and wall seconds by module, written when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        cpu0, wall0 = tree_cpu(), time.monotonic()
        yield
        module = item.nodeid.split("::", 1)[0]
        self.cpu[module] += tree_cpu() - cpu0
        self.wall[module] += time.monotonic() - wall0

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        out = self.path.with_name(f"{self.path.name}.{worker}.json")
        out.write_text(json.dumps({m: {"cpu": round(self.cpu[m], 1), "wall": round(self.wall[m], 1)}
                                   for m in self.cpu}, indent=1))


def register(config: pytest.Config) -> None:
    """When the log is asked for; called in each process that runs tests (tests/conftest.py)."""
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuLog(Path(path)), "cputime")


def report(path: Path) -> str:
    rows: dict[str, dict[str, float]] = {}
    for part in sorted(path.parent.glob(f"{path.name}.*.json")):
        rows.update(json.loads(part.read_text()))
    total = sum(r["cpu"] for r in rows.values()) or 1.0
    lines = [f"{'module':70} {'cpu s':>8} {'wall s':>8} {'cpu %':>6}"]
    for module, r in sorted(rows.items(), key=lambda kv: -kv[1]["cpu"]):
        lines.append(f"{module:70} {r['cpu']:8.0f} {r['wall']:8.0f} {100 * r['cpu'] / total:6.1f}")
    lines.append(f"{'total':70} {total:8.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
