"""What a test session leaves behind: processes, shared-memory segments, container monitors.

Every process a test starts inherits ``SERVING_TEST_SESSION`` (set once per session), so the
session can find its descendants at the end even after they were re-parented to init, which is
exactly when nobody else would notice them. Podman's container monitors (``conmon``) do not
inherit a caller's environment: one counts when it appeared during the session and its container
is gone (a monitor of nothing, as ``compose down`` used to leave them); one whose container still
exists belongs to a stack that is still up, maybe another session's. Shared-memory segments
(Triton's Python backend, multiprocessing) count when they appeared during the session and no
live process still maps them. Leftovers are named, then killed or removed, so that one run's leak
does not become the next one's.

Under pytest-xdist (``make test``) each worker checks its own processes and monitors; shared memory
has no owner to tell whose it is, so the controller checks it once every worker has ended. A worker
checking it would count, and remove, a segment another worker's PostgreSQL had just made. So that a
leftover segment still names its test, every test process logs the segments that appeared while each
test ran (``SHM_LOG``); the report names the tests that were running when a leftover appeared (under
xdist, any of the workers' tests running then).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARKER = "SERVING_TEST_SESSION"
SHM_LOG = "SERVING_TEST_SHM_LOG"  # the file where each test process logs which test saw a segment appear
SHM = Path("/dev/shm")
GRACE_S = 10.0
# Segments that are no test's to clean up: podman's lock table, made by the first podman call after boot
# and shared by every podman process until the machine stops (a fresh machine's first compose test
# makes it; removing it would only have the next podman call make it again).
HOST_SEGMENTS = frozenset({"libpod_lock"})


@dataclass
class Baseline:
    marker: str
    started: float
    shm: set[str] = field(default_factory=set)
    conmon: set[int] = field(default_factory=set)


def start_session() -> Baseline:
    marker = uuid.uuid4().hex
    os.environ[MARKER] = marker
    return Baseline(marker=marker, started=time.time(), shm=shm_names(), conmon=set(_conmons()))


def shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def _conmons() -> dict[int, str]:
    """Each conmon's pid and the id of the container it monitors (its ``-c ID`` argument)."""
    found = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        args = proc.info["cmdline"] or []
        if proc.info["name"] == "conmon" and "-c" in args[:-1]:
            found[proc.pid] = args[args.index("-c") + 1]
    return found


def _container_exists(container: str) -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "container", "exists", container], capture_output=True, timeout=30).returncode == 0


def _marked(marker: str) -> list[psutil.Process]:
    found, own = [], os.getpid()
    needle = f"{MARKER}={marker}".encode()
    for proc in psutil.process_iter():
        if proc.pid == own or _own_resource_tracker(proc, own):
            continue
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(proc)
    return found


def _own_resource_tracker(proc: psutil.Process, own: int) -> bool:
    """multiprocessing's resource tracker of the test process itself (a library used multiprocessing
    in-process): it lives as long as pytest does and ends with it, so it is no leftover."""
    try:
        return proc.ppid() == own and "multiprocessing.resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _mapped_shm() -> set[str | int]:
    """Names under /dev/shm that a live process has open or mapped, and the inodes mapped there: a
    POSIX semaphore (``sem_open``, e.g. multiprocessing's locks, which vLLM's workers open by name
    while starting) is mapped under a temporary name that is gone, so only its inode tells it."""
    names: set[str | int] = set()
    for pid in psutil.pids():
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
                    names.add(int(line.split()[4]))
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    names.add(target[len("/dev/shm/"):])
        except OSError:
            continue
    return names


def _describe(proc: psutil.Process) -> str:
    """Its command line, and the SERVING_HOME it runs under: tests give each stack a home of its
    own, so that names the test that started it."""
    try:
        home = next((v for v in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                     if v.startswith(b"SERVING_HOME=")), b"").decode(errors="replace")
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]} {home}".rstrip()
    except (OSError, psutil.Error):
        return f"pid {proc.pid}"


def collect(base: Baseline) -> list[str]:
    """Name the processes and monitors the session left, after giving graceful shutdowns ``GRACE_S``
    to finish; then kill them."""
    deadline = time.monotonic() + GRACE_S
    while (procs := _marked(base.marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = [f"process left running: {_describe(p)}" for p in procs]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    for pid, container in _conmons().items():
        if pid in base.conmon or _container_exists(container):
            continue
        try:
            proc = psutil.Process(pid)
            found.append(f"conmon of a removed container left running: {_describe(proc)}")
            proc.kill()
        except psutil.Error:
            pass
    return found


def start_shm_log(directory: Path) -> None:
    """Every test process started after this (xdist's workers too) logs new segments to one file."""
    os.environ[SHM_LOG] = str(directory / "shm-appeared.tsv")


def log_appeared(before: set[str], test: str) -> None:
    """Log the segments that appeared since ``before``, beside the test that was running."""
    log = os.environ.get(SHM_LOG)
    appeared = shm_names() - before
    if log and appeared:
        with open(log, "a") as out:
            out.writelines(f"{name}\t{test}\n" for name in sorted(appeared))


def _suspects(name: str) -> list[str]:
    log = os.environ.get(SHM_LOG)
    if not log or not Path(log).exists():
        return []
    rows = (line.rstrip("\n").split("\t", 1) for line in Path(log).read_text().splitlines())
    return sorted({row[1] for row in rows if len(row) == 2 and row[0] == name})


def collect_shm(base: Baseline) -> list[str]:
    """Name and remove the shared-memory segments made since ``base`` that no live process maps, with
    the tests that were running when each appeared."""
    found: list[str] = []
    new_shm = shm_names() - base.shm - HOST_SEGMENTS
    if new_shm:
        mapped = _mapped_shm()
        for name in sorted(new_shm - mapped):
            path = SHM / name
            try:
                stat = path.stat()
                if stat.st_mtime < base.started or stat.st_ino in mapped:
                    continue
                path.unlink()
            except OSError:
                continue
            suspects = _suspects(name)
            found.append(f"shared memory left in /dev/shm: {name}"
                         + (f" (appeared while these ran: {', '.join(suspects)})" if suspects else ""))
    return found
