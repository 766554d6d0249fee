"""`serving up`: the whole stack as child processes of one command, restarted when they crash.

Each component runs in its own process (as it would in a container) and its own process
group, so a crash in one is visible and the others keep going: workers serve from their cached
config while the control plane is away, and answer 503 with ``Retry-After`` while Triton is.
A child that exits (crash, ``kill -9``, OOM killer) has what is left of its process group
killed (Triton's Python-backend stubs) and is started again after a
backoff (0.5 s, doubling up to 10 s), with the reason logged. The supervisor stops only on
Ctrl-C or SIGTERM, or when one child crash-loops (``max_crashes`` exits within
``crash_window_s``): then it stops them all, newest first, and waits for each so no Triton
workspace or port is left behind. Children get SIGTERM should the supervisor itself die.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # one line per event, also in a log file

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def kill_group(pgid: int, grace_s: float = 1.0) -> None:
    """SIGTERM what is left of a dead child's process group, SIGKILL what is still there after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc: orphans reparented to an init
    that does not reap them stay zombies, and ``killpg(pgid, 0)`` would count them forever."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


@dataclass
class Child:
    name: str
    args: list[str]
    health_url: str | None
    proc: subprocess.Popen | None = None
    spawn: Callable[[], subprocess.Popen] | None = None  # how to start it when it is not a `serving` command
    crashes: deque = field(default_factory=deque)  # monotonic times of recent exits
    restarts: int = 0
    restart_at: float | None = None


def child_command(args: list[str]) -> list[str]:
    """``python -m serving.cli.main ARGS`` that imports the installed package even when the current
    directory holds a folder named ``serving`` (a common name in a user's project): ``-m`` puts the
    current directory first on ``sys.path``; ``-P`` (Python 3.11+) leaves it out. On 3.10 a
    ``-c`` bootstrap drops it before importing anything of ours."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "serving.cli.main", *args]
    bootstrap = ("import sys, runpy; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
                 "runpy.run_module('serving.cli.main', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", bootstrap, *args]


def safe_path_env(env: dict[str, str]) -> dict[str, str]:
    """Grandchildren (uvicorn's worker processes, multiprocessing's spawn, Triton's Python-backend
    stub) start interpreters of their own: PYTHONSAFEPATH keeps the current directory off their
    ``sys.path`` too (Python 3.11+; multiprocessing children also inherit the parent's path)."""
    return {**env, "PYTHONSAFEPATH": "1"}


@dataclass
class Supervisor:
    env: dict[str, str]
    log_dir: Path
    children: list[Child] = field(default_factory=list)
    max_crashes: int = 5
    crash_window_s: float = 60.0
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    poll_s: float = 0.2

    def start(self, child: Child, timeout: float = 60.0) -> None:
        self._spawn(child)
        self.children.append(child)
        if child.health_url:
            self._wait_healthy(child, timeout)
        console.print(f"[green]started[/green] {child.name} (pid {child.proc.pid})")

    def _spawn(self, child: Child) -> None:
        if child.spawn is not None:
            child.proc = child.spawn()
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{child.name}.log", "ab") as log:
            child.proc = subprocess.Popen(
                child_command(child.args), env=safe_path_env(self.env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def _wait_healthy(self, child: Child, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}); see {self.log_dir / child.name}.log")
            try:
                if httpx.get(child.health_url, timeout=1.0).status_code < 300:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{child.name} not healthy after {timeout:.0f}s; see {self.log_dir / child.name}.log")

    def wait(self) -> int:
        """Watch and restart children until told to stop (0) or one crash-loops (1)."""
        stop = {"flag": False}

        def on_signal(_sig, _frame):
            stop["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["flag"]:
            if not self.check():
                return 1
            time.sleep(self.poll_s)
        return 0

    def check(self) -> bool:
        """One pass: notice exits, schedule and do restarts. False when a child crash-loops."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                if not self._crashed(child, now):
                    return False
            elif child.proc is None and child.restart_at is not None and now >= child.restart_at:
                self._restart(child)
        return True

    def _crashed(self, child: Child, now: float) -> bool:
        code, pid = child.proc.returncode, child.proc.pid
        kill_group(pid)  # its own group: stubs and helpers a crash left behind go with it
        child.proc = None
        child.crashes.append(now)
        while child.crashes and now - child.crashes[0] > self.crash_window_s:
            child.crashes.popleft()
        log = self.log_dir / f"{child.name}.log"
        if len(child.crashes) >= self.max_crashes:
            console.print(f"[red]{child.name} (pid {pid}) {describe_exit(code)}: {len(child.crashes)} crashes in "
                          f"{self.crash_window_s:.0f}s, giving up and stopping the stack; see {log}[/red]")
            return False
        delay = min(self.backoff_s * 2 ** (len(child.crashes) - 1), self.max_backoff_s)
        child.restart_at = now + delay
        console.print(f"[yellow]{child.name} (pid {pid}) {describe_exit(code)}; restarting in {delay:.1f}s "
                      f"(crash {len(child.crashes)} of {self.max_crashes} allowed in {self.crash_window_s:.0f}s); "
                      f"see {log}[/yellow]")
        return True

    def _restart(self, child: Child) -> None:
        child.restart_at = None
        try:
            self._spawn(child)
        except Exception as exc:  # cannot even start (binary gone): counts as a crash
            console.print(f"[red]cannot restart {child.name}: {exc}[/red]")
            child.restart_at = time.monotonic() + self.max_backoff_s
            child.crashes.append(time.monotonic())
            return
        child.restarts += 1
        console.print(f"[green]restarted[/green] {child.name} (pid {child.proc.pid}, restart {child.restarts})")

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM to every child, SIGKILL to one still there after ``timeout`` (a worker gives its requests
        under way SERVING_WORKER_GRACEFUL_STOP_S, 20 s by default, to finish)."""
        for child in reversed(self.children):
            if child.proc and child.proc.poll() is None:
                _signal_group(child.proc.pid, signal.SIGTERM)
        for child in reversed(self.children):
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            kill_group(child.proc.pid, grace_s=2.0)  # anything of it still there
            console.print(f"stopped {child.name}")


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaped either way (no zombie, no orphan)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
