"""What a test session leaves behind: processes, shared-memory segments, container monitors.

Every process a test starts inherits ``SERVING_TEST_SESSION`` (set once per session), so the
session can find its descendants at the end even after they were re-parented to init, which is
exactly when nobody else would notice them. Shared-memory segments (Triton's Python backend,
multiprocessing) count when they appeared during the session and no live process still maps
them; ``conmon`` processes (podman's container monitors) when they appeared during the session.
Leftovers are killed or removed, and named, so one run's leak does not become the next one's.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARKER = "SERVING_TEST_SESSION"
SHM = Path("/dev/shm")
GRACE_S = 10.0


@dataclass
class Baseline:
    marker: str
    started: float
    shm: set[str] = field(default_factory=set)
    conmon: set[int] = field(default_factory=set)


def start_session() -> Baseline:
    marker = uuid.uuid4().hex
    os.environ[MARKER] = marker
    return Baseline(marker=marker, started=time.time(), shm=_shm_names(), conmon=set(_conmon_pids()))


def _shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def _conmon_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "conmon"]


def _marked(marker: str) -> list[psutil.Process]:
    found, own = [], os.getpid()
    needle = f"{MARKER}={marker}".encode()
    for proc in psutil.process_iter():
        if proc.pid == own:
            continue
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(proc)
    return found


def _mapped_shm() -> set[str]:
    """Names under /dev/shm that a live process has open or mapped."""
    names: set[str] = set()
    for pid in psutil.pids():
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    names.add(target[len("/dev/shm/"):])
        except OSError:
            continue
    return names


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


def collect(base: Baseline) -> list[str]:
    """Name what the session left, after giving graceful shutdowns ``GRACE_S`` to finish; then
    kill and remove it."""
    deadline = time.monotonic() + GRACE_S
    while (procs := _marked(base.marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = [f"process left running: {_describe(p)}" for p in procs]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    for pid in set(_conmon_pids()) - base.conmon:
        try:
            found.append(f"conmon left running (podman's container monitor): {_describe(psutil.Process(pid))}")
        except psutil.Error:
            pass
    new_shm = _shm_names() - base.shm
    if new_shm:
        mapped = _mapped_shm()
        for name in sorted(new_shm - mapped):
            path = SHM / name
            try:
                if path.stat().st_mtime < base.started:
                    continue
                path.unlink()
            except OSError:
                continue
            found.append(f"shared memory left in /dev/shm: {name}")
    return found
