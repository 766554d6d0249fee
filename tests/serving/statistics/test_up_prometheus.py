"""`serving up --prometheus`: Prometheus comes up with the stack, scrapes the statistics
service, and stops with everything else on Ctrl-C."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.serving.statistics.support import Prometheus, wait_until
from tests.support.procs import REPO, free_port, wait_http


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(180)
def test_up_starts_prometheus_pointed_at_statistics(tmp_path: Path) -> None:
    ports = {k: free_port() for k in ("cp", "worker", "stats", "prometheus")}
    home = tmp_path / "home"
    env = {**os.environ, "SERVING_HOME": str(home), "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
           "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
           "SERVING_STATISTICS_PORT": str(ports["stats"])}
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "up", "--no-triton", "--port",
                               str(ports["worker"]), "--prometheus", "--prometheus-port", str(ports["prometheus"])],
                              env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(f"http://127.0.0.1:{ports['prometheus']}")
        wait_http(prom.url + "/-/ready", timeout=120, proc=up)
        target = f'up{{job="serving-statistics", instance="127.0.0.1:{ports["stats"]}"}}'
        assert prom.wait_value(target, 1.0, timeout=40) == 1.0  # 15 s scrape interval
        rules = wait_until(lambda: httpx.get(prom.url + "/api/v1/rules").json()["data"]["groups"],
                           what="alert rules loaded")
        assert {g["name"] for g in rules} == {"serving-slo", "serving-drift", "serving-statistics"}
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=60)
    assert code == 0, (tmp_path / "up.log").read_text()[-2000:]
    assert "started prometheus" in (tmp_path / "up.log").read_text()
    assert [name for name, port in ports.items() if port_open(port)] == []
