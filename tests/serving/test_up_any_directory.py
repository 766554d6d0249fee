"""`serving up` works from a directory that holds a folder named `serving` (issue 19 item 4).

`python -m` puts the current directory first on `sys.path`, so children started that way imported
the user's `serving/` folder instead of the installed package and died
(`cannot import name '__version__' from 'serving' (unknown location)`). A real `serving up` (the
installed console script, as a user runs it) is started from such a directory; its worker
processes must answer, the v2 server metadata (which reads `serving.__version__`) included.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serving import __version__
from tests.support.procs import free_port, wait_http


@pytest.mark.timeout(240)
def test_serving_up_from_a_directory_holding_a_serving_folder(tmp_path):
    project = tmp_path / "project"
    (project / "serving").mkdir(parents=True)
    (project / "serving" / "model_card.md").write_text("a user's own folder, not a package\n")
    ports = {k: free_port() for k in ("cp", "worker", "stats", "llm")}
    env = {**os.environ, "SERVING_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1",
           "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]), "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
           "SERVING_STATISTICS_PORT": str(ports["stats"]), "SERVING_LLM_LAUNCHER_PORT": str(ports["llm"])}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONSAFEPATH", None)
    serving_script = Path(sys.executable).with_name("serving")
    log = tmp_path / "up.log"
    up = subprocess.Popen([str(serving_script), "up", "--no-triton", "--workers", "2", "--port", str(ports["worker"])],
                          cwd=project, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{ports['worker']}/v2/health/live", timeout=180, proc=up)
        for _ in range(6):  # connections land on either worker process
            r = httpx.get(f"http://127.0.0.1:{ports['worker']}/v2", timeout=10)
            assert r.status_code == 200 and r.json()["version"] == __version__, r.text
        assert httpx.get(f"http://127.0.0.1:{ports['cp']}/health", timeout=10).status_code == 200
        assert "cannot import name" not in log.read_text()
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
        print(log.read_text()[-2000:])
