"""The one way tests start the platform as real processes: on free loopback ports, under a home of
their own, driven through the `serving` CLI. Components apart (``start_control_plane``,
``start_worker``, ``start_triton``) or the whole stack from one command (``up``); waiting
(``tests.support.procs.wait_http``/``wait_until``) and stopping in one place, every process
stopped by ``stop_all`` (the session's leftover check, tests/support/leftovers.py, catches any
that is not). In-process workers: tests/serving/worker/support.py; compose: tests/deploy."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import auth
from tests.support.procs import REPO, free_port, stop, wait_http


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    worker_ports: list[int] = field(default_factory=list)

    @property
    def control_plane(self) -> str:
        return self.env["SERVING_CONTROL_PLANE_URL"]

    def headers(self, role: str = "admin") -> dict[str, str]:
        """The bootstrap token the control plane wrote under SERVING_HOME (the CLI finds it there too)."""
        return auth.headers(self.home, role)

    def api(self, role: str = "admin", **kw) -> httpx.Client:
        """An HTTP client of the control plane holding a token of ``role``."""
        return httpx.Client(base_url=self.control_plane, headers=self.headers(role), **kw)

    def worker_url(self, i: int = 0) -> str:
        return f"http://127.0.0.1:{self.worker_ports[i]}"

    def cli(self, *args: str, check: bool = True, timeout: float = 360.0) -> subprocess.CompletedProcess:
        """``serving ARGS``; ``timeout`` above the CLI's own ``--wait-timeout`` (300 s), so a deploy that is
        slow on a busy machine fails with the CLI's message, not a subprocess timeout (it did at 120 s)."""
        res = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=self.env, cwd=REPO,
                             capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"serving {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def log(self, name: str) -> Path:
        return self.home / f"{name}.log"

    def start(self, name: str, args: list[str], health: str, extra_env: dict[str, str] | None = None,
              timeout: float = 60.0, cwd: Path = REPO) -> subprocess.Popen:
        log = open(self.log(name), "ab")
        proc = subprocess.Popen([sys.executable, "-m", "serving.cli.main", *args], env={**self.env, **(extra_env or {})},
                                cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        try:
            wait_http(health, timeout=timeout, proc=proc)
        except Exception:
            raise RuntimeError(f"{name} failed to start:\n{self.log(name).read_text()[-3000:]}")
        return proc

    def start_control_plane(self) -> None:
        self.start("control-plane", ["control-plane"], f"{self.control_plane}/health")

    def start_worker(self, i: int) -> None:
        port = self.worker_ports[i]
        self.start(f"worker{i}", ["worker"], f"http://127.0.0.1:{port}/v2/health/live",
                   {"SERVING_WORKER_PORT": str(port), "SERVING_WORKER_CACHE": str(self.home / f"worker{i}.json")})

    def start_llm(self) -> None:
        """The LLM launcher (`serving llm`): vLLM engines of --engine vllm endpoints (serving/llm/)."""
        self.start("llm", ["llm"], f"{self.llm_launcher_url}/health")

    @property
    def llm_launcher_url(self) -> str:
        return self.env["SERVING_LLM_LAUNCHER_URL"]

    def statistics_url(self) -> str:
        return f"http://127.0.0.1:{self.env['SERVING_STATISTICS_PORT']}"

    def start_statistics(self) -> None:
        self.start("statistics", ["statistics"], f"{self.statistics_url()}/health")

    def start_triton(self) -> None:
        port = self.env["SERVING_TRITON_HTTP_PORT"]
        self.start("triton", ["triton"], f"http://127.0.0.1:{port}/v2/health/live", timeout=120)

    def start_components(self, statistics: bool = True, triton: bool = False) -> "Stack":
        """The platform as separate processes, as a deployment runs it: control plane, statistics
        service, embedded Triton, and each worker on its own port (so a test knows which it reaches)."""
        self.start_control_plane()
        if statistics:
            self.start_statistics()
        if triton:
            self.start_triton()
        for i in range(len(self.worker_ports)):
            self.start_worker(i)
        return self

    def up(self, workers: int = 2, *args: str, cwd: Path = REPO, timeout: float = 150.0,
           ready: str | None = None) -> subprocess.Popen:
        """`serving up [ARGS]`: control plane, embedded Triton, statistics and ``workers`` worker
        processes on ``worker_url(0)``, from one command, as a user starts it (``cwd``: where they
        typed it); waits for ``ready`` (default: the workers' health)."""
        return self.start("up", ["up", "--workers", str(workers), "--port", str(self.worker_ports[0]), *args],
                          ready or f"{self.worker_url()}/v2/health/live", timeout=timeout, cwd=cwd)

    def interrupt(self, name: str = "up", timeout: float = 60.0) -> int:
        """Ctrl-C, as a user stops `serving up`; its exit code."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=timeout)

    def ports(self) -> dict[str, int]:
        """Every port this stack's processes listen on."""
        found = {k: int(v) for k, v in self.env.items() if k.endswith("_PORT") and v.isdigit() and int(v) > 0}
        return found | {f"worker{i}": port for i, port in enumerate(self.worker_ports)}

    def stop(self, name: str) -> None:
        stop(self.procs.pop(name))

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name)

    def revision(self, i: int) -> int:
        return httpx.get(f"{self.worker_url(i)}/status", timeout=5).json()["revision"]


def make_stack(home: Path, workers: int = 2) -> Stack:
    home.mkdir(parents=True, exist_ok=True)
    ports = {k: free_port() for k in ("cp", "http", "grpc", "metrics", "stats", "loader", "llm")}
    inherited = {k: v for k, v in os.environ.items()  # tokens come from the control plane's files under home
                 if k not in ("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")}
    env = {
        **inherited, "SERVING_HOME": str(home), "SERVING_CREDENTIALS": str(home / "credentials"),
        "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
        "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
        "SERVING_TRITON_HTTP_PORT": str(ports["http"]), "SERVING_TRITON_GRPC_PORT": str(ports["grpc"]),
        "SERVING_TRITON_METRICS_PORT": str(ports["metrics"]),
        "SERVING_TRITON_GRPC_URL": f"127.0.0.1:{ports['grpc']}",
        "SERVING_TRITON_LOADER_PORT": str(ports["loader"]),
        "SERVING_TRITON_LOADER_URL": f"http://127.0.0.1:{ports['loader']}",
        "SERVING_STATISTICS_PORT": str(ports["stats"]),
        "SERVING_LLM_LAUNCHER_PORT": str(ports["llm"]),
        "SERVING_LLM_LAUNCHER_URL": f"http://127.0.0.1:{ports['llm']}",
        "PYTHONUNBUFFERED": "1",
    }
    return Stack(home=home, env=env, worker_ports=[free_port() for _ in range(workers)])
