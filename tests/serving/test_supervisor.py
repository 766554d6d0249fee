"""`serving up` heals itself: a crashed child is restarted with backoff, what it left behind dies with it,
and only a crash loop (or Ctrl-C) stops the stack. The end-to-end test kills real children of a real
`serving up` under load and counts what clients saw."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from serving.supervisor import Child, Supervisor
from tests.serving.stack import make_stack
from tests.support.procs import wait_until


def sleeper(grandchild: bool = False) -> subprocess.Popen:
    """A child in its own group; with ``grandchild`` it leaves one behind when it dies (as Triton's stubs)."""
    code = "import time; time.sleep(600)"
    if grandchild:
        code = ("import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def run_checks(sup: Supervisor, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not sup.check():
            return False
        time.sleep(0.05)
    return True


def test_crashed_child_is_restarted_and_its_leftovers_killed(tmp_path):
    sup = Supervisor({}, tmp_path, backoff_s=0.1)
    child = Child("c", [], None, spawn=lambda: sleeper(grandchild=True))
    sup.start(child)
    try:
        wait_until(lambda: len(psutil.Process(child.proc.pid).children()) == 1, 10, "grandchild started")
        first, grandchild = child.proc.pid, psutil.Process(child.proc.pid).children()[0]
        os.kill(first, signal.SIGKILL)
        assert run_checks(sup, 1.0)
        assert child.restarts == 1 and child.proc.pid != first and child.proc.poll() is None
        grandchild.wait(5)  # killed with its dead parent's process group, not left as an orphan
    finally:
        sup.stop_all(timeout=5)
    assert child.proc.poll() is not None


def test_crash_loop_stops_the_stack_with_backoff(tmp_path):
    sup = Supervisor({}, tmp_path, backoff_s=0.05, max_crashes=5, crash_window_s=60)
    steady = Child("steady", [], None, spawn=sleeper)
    looping = Child("looping", [], None,
                    spawn=lambda: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True))
    sup.start(steady)
    sup.start(looping)
    t0 = time.monotonic()
    try:
        assert not run_checks(sup, 30), "a child crashing 5 times in 60 s must stop the supervisor"
        # backoff doubles: 0.05 + 0.1 + 0.2 + 0.4 s between the five starts, at least
        assert time.monotonic() - t0 >= 0.75 and looping.restarts == 4
        assert steady.restarts == 0 and steady.proc.poll() is None
    finally:
        sup.stop_all(timeout=5)


# --- end to end: `serving up` under load ---------------------------------------------------------


@dataclass
class Load:
    """Closed-loop clients on keep-alive connections; every answer and error is kept with its time."""

    url: str
    clients: int = 4
    results: list[tuple[float, int, str]] = field(default_factory=list)  # (time, status or -1, detail)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "Load":
        for _ in range(self.clients):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(self.url, json={"text": "a fine day"})
                    self.results.append((time.monotonic(), r.status_code, r.headers.get("Retry-After", "")))
                except httpx.HTTPError as exc:
                    self.results.append((time.monotonic(), -1, f"{type(exc).__name__}: {exc}"))
                self._stop.wait(0.02)  # unpaced, 4 clients kept both cores busy and slowed the rest of the suite

    def since(self, t0: float) -> list[tuple[float, int, str]]:
        return [r for r in list(self.results) if r[0] >= t0]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)


def children(up: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(up.pid).children(recursive=True)


def find(up: subprocess.Popen, predicate) -> psutil.Process:
    found = [p for p in children(up) if _safe(predicate, p)]
    assert found, "process not found"
    return found[0]


def _safe(predicate, p: psutil.Process) -> bool:
    try:
        return predicate(p.cmdline())
    except psutil.Error:
        return False


def is_cli(command: str):
    def match(cmd: list[str]) -> bool:  # python [-P] -m serving.cli.main COMMAND ...
        return "serving.cli.main" in cmd and cmd[cmd.index("serving.cli.main") + 1:][:1] == [command]
    return match


def is_tritonserver(cmd):
    return bool(cmd) and cmd[0].endswith("/bin/tritonserver")


def is_stub(cmd):
    return bool(cmd) and cmd[0].endswith("triton_python_backend_stub")


@pytest.mark.timeout(420)
def test_up_heals_kill_9_of_control_plane_triton_and_a_worker(tmp_path, tiny_model):
    stack = make_stack(tmp_path / "home", workers=1)
    env, log_path = stack.env, stack.log("up")
    report: dict[str, object] = {}
    load = None
    try:
        up = stack.up(workers=2)
        stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        stack.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--tokenizer", str(tiny_model.tokenizer_dir))
        url = f"{stack.worker_url()}/serve/clf"
        wait_until(lambda: httpx.post(url, json={"text": "hello"}, timeout=10).status_code == 200, 60, "clf answers")
        load = Load(url).start()
        time.sleep(2)

        # 1. the control plane: workers serve from their config, it comes back by itself
        cp = find(up, is_cli("control-plane"))
        t0 = time.monotonic()
        cp.kill()
        wait_until(lambda: httpx.get(f"{env['SERVING_CONTROL_PLANE_URL']}/health", timeout=2).status_code == 200,
                   30, "the control plane is back")
        report["control plane back after s"] = round(time.monotonic() - t0, 1)
        time.sleep(2)
        during = load.since(t0)
        failed = [r for r in during if r[1] != 200]
        report["control plane kill: requests, failed"] = (len(during), len(failed))
        assert during and failed == [], failed[:5]
        assert find(up, is_cli("control-plane")).pid != cp.pid

        # 2. tritonserver: only 503 with Retry-After meanwhile, answers back by themselves within 15 s
        triton = find(up, is_tritonserver)
        stubs = [p for p in children(up) if _safe(is_stub, p)]
        assert stubs
        t0 = time.monotonic()
        triton.kill()
        wait_until(lambda: any(r[1] == 200 for r in load.since(t0 + 0.5)) and load.since(time.monotonic() - 1)
                   and all(r[1] == 200 for r in load.since(time.monotonic() - 1)), 30, "answers are back")
        recovered = min(r[0] for r in load.since(t0 + 0.5) if r[1] == 200)
        report["triton kill: answers back after s"] = round(recovered - t0, 1)
        during = load.since(t0)
        bad = [r for r in during if r[1] != 200 and not (r[1] == 503 and r[2])]
        report["triton kill: requests, 503, other failures"] = (
            len(during), sum(r[1] == 503 for r in during), len(bad))
        assert bad == [], bad[:5]
        assert recovered - t0 <= 15
        for stub in stubs:  # the old server's stubs died with it
            assert not stub.is_running() or stub.status() == psutil.STATUS_ZOMBIE, stub

        # 3. one of two worker processes: at most the requests in flight are lost
        master = find(up, is_cli("worker"))
        workers = [p for p in master.children() if "multiprocessing" in " ".join(p.cmdline())
                   and "resource_tracker" not in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in master.children()]
        victim = workers[0]
        t0 = time.monotonic()
        victim.kill()
        time.sleep(5)
        during = load.since(t0)
        failed = [r for r in during if r[1] != 200]
        report["worker kill: requests, failed"] = (len(during), len(failed))
        assert len(failed) <= load.clients, failed
        wait_until(lambda: len([p for p in master.children() if p.is_running()
                                and p.status() != psutil.STATUS_ZOMBIE]) == len(master.children()) and
                   victim.pid not in [p.pid for p in master.children()] and
                   len(master.children()) >= 2, 30, "uvicorn replaced the worker process")
        assert up.poll() is None
    finally:
        if load is not None:
            load.stop()
        print("measured:", report)
        code = stack.interrupt()
    assert code == 0, log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert "control-plane (pid" in text and "was killed by SIGKILL; restarting" in text, text[-3000:]
