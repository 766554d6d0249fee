"""`serving up --prometheus`: Prometheus comes up with the stack, scrapes the statistics
service, and stops with everything else on Ctrl-C."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.serving.statistics.support import Prometheus
from tests.serving.stack import make_stack
from tests.support.procs import free_port, port_open, wait_until


@pytest.mark.timeout(180)
def test_up_starts_prometheus_pointed_at_statistics(tmp_path: Path) -> None:
    stack = make_stack(tmp_path / "home", workers=1)
    prom = Prometheus(f"http://127.0.0.1:{free_port()}")
    stats_port = stack.env["SERVING_STATISTICS_PORT"]
    try:
        stack.up(1, "--no-triton", "--prometheus", "--prometheus-port", prom.url.rsplit(":", 1)[1],
                 ready=prom.url + "/-/ready", timeout=120)
        target = f'up{{job="serving-statistics", instance="127.0.0.1:{stats_port}"}}'
        assert prom.wait_value(target, 1.0, timeout=40) == 1.0  # 15 s scrape interval
        rules = wait_until(lambda: httpx.get(prom.url + "/api/v1/rules").json()["data"]["groups"],
                           what="alert rules loaded")
        assert {g["name"] for g in rules} == {"serving-slo", "serving-drift", "serving-models", "serving-statistics"}
    finally:
        code = stack.interrupt()
    assert code == 0, stack.log("up").read_text()[-2000:]
    assert "started prometheus" in stack.log("up").read_text()
    ports = stack.ports() | {"prometheus": int(prom.url.rsplit(":", 1)[1])}
    assert [name for name, port in ports.items() if port_open(port)] == []
