"""What each system of the TorchServe benchmark spent, by part, and what the rest of the machine did
meanwhile (benchmarks/torchserve.py measures with these): CPU seconds of its processes from psutil, the
machine's from /proc/stat, the benchmark's own (and wrk's, once exited) from getrusage."""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.torchserve_systems import role


@dataclass
class Snapshot:
    """CPU seconds of a system's processes (by pid, with their part), of the whole machine, of us."""

    procs: dict[int, tuple[str, float]]
    machine_busy_s: float
    steal_s: float
    own_s: float
    at: float


def _proc_cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return None


def machine_cpu() -> tuple[float, float]:
    """The machine's busy and stolen CPU seconds since boot, all cores (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def snapshot(procs: list[psutil.Process]) -> Snapshot:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk, once it has exited
    busy, steal = machine_cpu()
    found = {}
    for proc in procs:
        cpu = _proc_cpu(proc)
        if cpu is not None:
            found[proc.pid] = (role(proc), cpu)
    return Snapshot(found, busy, steal, own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime,
                    time.monotonic())


def cpu_between(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Each part's CPU seconds between two snapshots (a process started meanwhile counts whole), and
    what the rest of the machine used: busy time less this system's and this benchmark's own."""
    parts: dict[str, float] = {}
    for pid, (name, cpu) in after.procs.items():
        parts[name] = parts.get(name, 0.0) + cpu - before.procs.get(pid, (name, 0.0))[1]
    system = sum(parts.values())
    wall = after.at - before.at
    foreign = max(0.0, after.machine_busy_s - before.machine_busy_s - system - (after.own_s - before.own_s))
    cores = os.cpu_count() or 1
    return {"cpu_s": system, "cpu_s_by_part": {k: round(v, 3) for k, v in sorted(parts.items())},
            "foreign_cpu_share": foreign / (wall * cores) if wall > 0 else 0.0,
            "steal_share": (after.steal_s - before.steal_s) / (wall * cores) if wall > 0 else 0.0}


def settle(procs: list[psutil.Process], busy_cores: float = 0.15, timeout_s: float = 90.0) -> float:
    """Wait until the system is idle again; the seconds it took. wrk closes its connections when its time is
    up, but requests already queued are still computed (by TorchServe and the platform alike): a slow
    configuration would otherwise go on taking the CPU while the next one is measured."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = sum(filter(None, map(_proc_cpu, procs)))
        time.sleep(0.3)
        if (sum(filter(None, map(_proc_cpu, procs))) - before) / 0.3 < busy_cores:
            break
    return round(time.monotonic() - started, 2)
