"""Child processes on free loopback ports, always stopped (with their children) on exit.

Every system under test runs as real processes, as in production; a benchmark
that leaves a Triton or a worker behind would skew the next system's numbers,
so each child gets its own session and the whole group is killed at the end.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import httpx

from serving.ports import free_port

__all__ = ["REPO", "child_env", "descendants", "free_port", "process", "run_threads", "stop", "wait_http"]
REPO = Path(__file__).resolve().parents[1]


def child_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """Our environment plus the repo on PYTHONPATH, so ``python -m benchmarks...`` resolves; a
    ``None`` in ``extra`` removes that variable."""
    env = {k: v for k, v in {**os.environ, **(extra or {})}.items() if v is not None}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@contextmanager
def process(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Run ``python ARGS`` with output to ``log``; on exit SIGTERM the group, then SIGKILL."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, *args], env=child_env(env), cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop the process group: a Triton or uvicorn parent leaves its children otherwise."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)  # stragglers of the group, even if the parent exited
    if proc.poll() is None:
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_http(url: str, timeout: float, procs: list[subprocess.Popen] | None = None,
              method: str = "GET", json: object | None = None) -> None:
    """Poll ``url`` until it answers 2xx; fail at once if one of ``procs`` died."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        for proc in procs or []:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, proc.args[1:4]))} exited with {proc.returncode}")
        try:
            resp = httpx.request(method, url, json=json, timeout=5.0)
            if resp.status_code < 300:
                return
            last = f"HTTP {resp.status_code}: {resp.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s (last: {last})")


def descendants(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc), for profiling every worker of a server."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def run_threads(target: Callable[[], None], count: int) -> None:
    """``count`` threads of ``target`` side by side (load clients, streams); returns when all end."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
