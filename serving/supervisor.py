"""`serving up`: the whole stack as child processes of one command.

Each component runs in its own process (as it would in a container) so a crash
in one is visible and the others keep going; Ctrl-C or SIGTERM stops them all,
newest first, and waits for each so no Triton workspace or port is left behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console

console = Console(stderr=True)


@dataclass
class Child:
    name: str
    args: list[str]
    health_url: str | None
    proc: subprocess.Popen | None = None


@dataclass
class Supervisor:
    env: dict[str, str]
    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, child: Child, timeout: float = 60.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{child.name}.log", "ab")
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "serving.cli.main", *child.args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.children.append(child)
        if child.health_url:
            self._wait_healthy(child, timeout)
        console.print(f"[green]started[/green] {child.name} (pid {child.proc.pid})")

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
        """Block until a child dies or we are told to stop; returns an exit code."""
        stop = {"flag": False}

        def on_signal(_sig, _frame):
            stop["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["flag"]:
            for child in self.children:
                if child.proc.poll() is not None:
                    console.print(f"[red]{child.name} exited with {child.proc.returncode}[/red]")
                    return 1
            time.sleep(0.3)
        return 0

    def stop_all(self, timeout: float = 15.0) -> None:
        for child in reversed(self.children):
            if child.proc and child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGTERM)
        for child in reversed(self.children):
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            console.print(f"stopped {child.name}")
