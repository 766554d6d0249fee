"""Real processes for the statistics tests: the service, Prometheus, worker-like senders."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from serving.statistics.prometheus_config import start_prometheus
from serving.credentials import new_token
from tests.support.procs import REPO, free_port, stop, wait_http

WORKER_TOKEN = new_token()  # shared by the service and the workers the tests start with its env
DRIFT_ARGS = ["--reference-size", "200", "--window-size", "200", "--min-window", "50"]


@dataclass
class Service:
    proc: subprocess.Popen
    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/health", timeout=5).json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    @property
    def headers(self) -> dict[str, str]:
        """The worker token the service was started with (ingestion refuses events without it)."""
        return {"Authorization": f"Bearer {self.env['SERVING_WORKER_TOKEN']}"}


@contextmanager
def statistics_service(home: Path, control_plane_url: str, args: list[str] = DRIFT_ARGS,
                       extra_env: dict[str, str] | None = None) -> Iterator[Service]:
    """``python -m serving.statistics`` on a free port, stopped on exit."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SERVING_")}
    env = {**base, "SERVING_HOME": str(home), "SERVING_CONTROL_PLANE_URL": control_plane_url,
           "SERVING_STATISTICS_PORT": str(port), "SERVING_STATISTICS_HOST": "127.0.0.1",
           "SERVING_WORKER_TOKEN": WORKER_TOKEN, **(extra_env or {})}
    with open(home / "statistics.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "serving.statistics", *args], env=env, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=30, proc=proc)
            yield Service(proc, port, env)
        finally:
            stop(proc)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"PromQL {expr!r} failed: {body.get('error')}")
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, accept: Callable[[float], bool], timeout: float = 20.0) -> float:
        """Poll ``expr`` (one series) until ``accept(value)``; returns the value."""
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            value = self.scalar(expr)
            if value is not None and accept(value):
                return value
            time.sleep(0.25)
        raise TimeoutError(f"{expr}: last value {value}")

    def wait_value(self, expr: str, expected: float, timeout: float = 20.0) -> float:
        return self.wait_for(expr, lambda v: v == expected, timeout)

    def metric_names(self) -> set[str]:
        return set(httpx.get(self.url + "/api/v1/label/__name__/values", timeout=10).json()["data"])


@contextmanager
def prometheus(workdir: Path, targets: list[str]) -> Iterator[Prometheus]:
    """Debian's ``prometheus`` started exactly as ``serving up --prometheus`` does it
    (shipped config and alert rules), but with 1 s scrapes and rule evaluations."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
    port = free_port()
    proc = start_prometheus(workdir, targets, f"127.0.0.1:{port}", scrape_interval="1s")
    try:
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        stop(proc)


def run_workers(env: dict[str, str], jobs: list[tuple[str, int, int, str, int]], timeout: float = 120) -> list[dict]:
    """Run one worker_sim process per job concurrently; each must flush without drops."""
    procs = [subprocess.Popen([sys.executable, "-m", "tests.serving.statistics.worker_sim", *map(str, job)],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for job in jobs]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}): {out.decode()} {err.decode()[-2000:]}"
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert len({r["source"] for r in results}) == len(results), "workers must be separate processes"
    return results
