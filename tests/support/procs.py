"""Start real child processes on free loopback ports and wait for them to answer."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
