"""Start real child processes on free loopback ports and wait for them to answer."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import psutil

from serving.ports import free_port
from serving.supervisor import stop_process

__all__ = ["REPO", "WaitTimeout", "free_port", "port_open", "serving_process", "stop", "wait_http", "wait_until"]
REPO = Path(__file__).resolve().parents[2]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class WaitTimeout(AssertionError, TimeoutError):
    """A condition a test waited for did not come: a failed assertion, and a timeout."""


def wait_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "", interval: float = 0.1,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``check`` until it returns something truthy, and return that. What a server that is
    starting or restarting raises (refused connections, a key or an index not there yet, a body
    that is not JSON yet) counts as not yet; the last value or error, and ``on_timeout()`` (a log
    tail), are in the failure."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError, KeyError, IndexError, ValueError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    extra = f"\n{on_timeout()}" if on_timeout is not None else ""
    raise WaitTimeout(f"timed out after {timeout}s waiting for {what or check}: last {last!r}{extra}")


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 2xx; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2.0).status_code < 300:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


@contextmanager
def serving_process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """Run ``python -m serving.cli.main ARGS`` (the `serving` CLI) and stop it on exit."""
    full_env = {**os.environ, **env}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving.cli.main", *args],
            env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )
        try:
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    stop_process(proc, timeout)


def kill_all(procs: list[psutil.Process], what: str = "pid") -> list[str]:
    """SIGKILL each of ``procs`` (one already gone is skipped); what was killed, for a report."""
    killed = []
    for proc in procs:
        try:
            killed.append(f"{what} {proc.pid}: {' '.join(proc.cmdline())[:160]}")
            proc.kill()
        except psutil.Error:
            pass
    return killed
