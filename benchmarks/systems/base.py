"""The contract between the runner and a system under test."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from benchmarks.modes import Mode
from benchmarks.results import SystemResult
from benchmarks.workloads import PreparedWorkload


class Unavailable(Exception):
    """The system cannot run here (a part of the platform not built yet, a missing package).

    Reported as such in the results instead of failing the whole run.
    """


@dataclass
class Target:
    """One configuration of a running system, ready to take load.

    ``payload`` names the request builder in ``benchmarks.payloads``; ``procs``
    are the server processes (the profiler attaches to them).
    """

    system: str
    label: str
    url: str
    payload: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request (a client key)


@dataclass
class RunContext:
    """What every system gets: the workload's files, the corpus, the mode and where to log."""

    workload: PreparedWorkload
    corpus_path: Path
    mode: Mode
    log_dir: Path
    variants: frozenset[str] = frozenset()  # the Target ids asked for; empty: all

    def wants(self, variant: str) -> bool:
        return not self.variants or variant in self.variants


# A system: a generator of Targets; it keeps its processes alive between yields and stops
# them in ``finally`` (the runner closes it). It raises Unavailable before its first yield
# when it cannot run here.
SystemFn = Callable[[RunContext], Iterator[Target]]


@dataclass(frozen=True)
class System:
    """A system under test: served over HTTP (``targets``) or measured in-process (``measure``)."""

    name: str
    description: str
    variants: tuple[str, ...]   # ids of what it yields, for --systems filtering and progress
    targets: SystemFn | None = None
    measure: Callable[[RunContext], "SystemResult"] | None = None
    workloads: tuple[str, ...] | None = None  # the workloads it serves; None: every model workload (not W0)

    def serves(self, workload: str) -> bool:
        from benchmarks.workloads import NO_MODEL

        return workload in self.workloads if self.workloads is not None else workload not in NO_MODEL
