"""`serving up`: the whole stack from one command serves a model, and Ctrl-C stops every child."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from tests.serving.test_stack_e2e import wait_until
from tests.support.procs import REPO, free_port, wait_http


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(240)
def test_up_serves_and_ctrl_c_stops_everything(tmp_path, tiny_model):
    ports = {k: free_port() for k in ("cp", "worker", "http", "grpc", "metrics", "stats")}
    env = {**os.environ, "SERVING_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1",
           "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
           "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
           "SERVING_TRITON_HTTP_PORT": str(ports["http"]), "SERVING_TRITON_GRPC_PORT": str(ports["grpc"]),
           "SERVING_TRITON_METRICS_PORT": str(ports["metrics"]), "SERVING_TRITON_GRPC_URL": f"127.0.0.1:{ports['grpc']}",
           "SERVING_STATISTICS_PORT": str(ports["stats"])}
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "up", "--workers", "2",
                           "--port", str(ports["worker"])], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{ports['worker']}/v2/health/live", timeout=150, proc=up)
        cli = [sys.executable, "-m", "serving.cli.main"]
        subprocess.run([*cli, "model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path)],
                       env=env, check=True, capture_output=True)
        subprocess.run([*cli, "model", "add", "--endpoint", "clf", "--model", "clf", "--tokenizer",
                        str(tiny_model.tokenizer_dir)], env=env, check=True, capture_output=True)
        url = f"http://127.0.0.1:{ports['worker']}/serve/clf"
        wait_until(lambda: httpx.post(url, json={"text": "hello"}, timeout=10).status_code == 200, 60, "clf answers")
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=60)
    assert code == 0, (tmp_path / "up.log").read_text()[-2000:]
    still_open = [name for name, port in ports.items() if port_open(port)]
    assert still_open == [], f"ports still served after Ctrl-C: {still_open}"
