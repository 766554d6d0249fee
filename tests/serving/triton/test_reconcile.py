"""The embedded Triton holds what the registry deploys, whatever happens to it: a redeploy churn
(M:1 -> M:2 -> M:1, which once broke a version for good), a model unloaded through Triton's own
control API, a tritonserver killed with ``kill -9``. Real processes on real sockets."""
from __future__ import annotations

import re
import time

import httpx
import psutil
import pytest

from tests.serving.stack import make_stack
from tests.support.procs import wait_until


def answered_by(url: str, version: int) -> bool:
    r = httpx.post(url, json={"text": "churn"}, timeout=30)
    return r.status_code == 200 and r.headers.get("X-Model-Version") == str(version)


def _running(proc: psutil.Process, suffix: str) -> list[psutil.Process]:
    found = []
    for p in proc.children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.cmdline() and p.cmdline()[0].endswith(suffix):
                found.append(p)
        except psutil.Error:
            continue
    return found


def tritonserver(proc: psutil.Process) -> psutil.Process:
    found = _running(proc, "/bin/tritonserver")
    assert len(found) == 1, found
    return found[0]


def stubs(proc: psutil.Process) -> list[psutil.Process]:
    return _running(proc, "triton_python_backend_stub")


@pytest.mark.timeout(400)
def test_churn_external_unload_and_kill_9_are_reconciled(tmp_path, tiny_model):
    stack = make_stack(tmp_path, workers=1)
    report: dict[str, float] = {}
    try:
        stack.start_control_plane()
        stack.start_triton()
        stack.start_worker(0)
        for _ in range(2):
            stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        url = f"{stack.worker_url(0)}/serve/clf"

        # 1. redeploy churn: every version answers again each time it comes back
        for step, version in enumerate([1, 2, 1, 2]):
            t0 = time.monotonic()
            stack.cli("model", "add", "--endpoint", "clf", "--model", f"clf:{version}",
                      "--tokenizer", str(tiny_model.tokenizer_dir))
            wait_until(lambda: answered_by(url, version), 45, f"clf:{version} answers (step {step})", interval=0.2)
            report[f"churn step {step} (clf:{version}) s"] = round(time.monotonic() - t0, 1)
        for _ in range(5):
            r = httpx.post(url, json={"text": "churn"}, timeout=30)
            assert r.status_code == 200 and r.headers["X-Model-Version"] == "2", (r.status_code, r.text)

        # 2. a model unloaded behind the registry's back through Triton's control API is loaded again
        server = psutil.Process(stack.procs["triton"].pid)
        token = re.search(r"triton-access-token=([^\s,;]+)", " ".join(tritonserver(server).cmdline())).group(1)
        port = stack.env["SERVING_TRITON_HTTP_PORT"]
        r = httpx.post(f"http://127.0.0.1:{port}/v2/repository/models/clf_v2/unload",
                       headers={"triton-access-token": token}, json={}, timeout=60)
        assert r.status_code == 200, r.text
        t0 = time.monotonic()
        wait_until(lambda: answered_by(url, 2), 30, "clf:2 is loaded again", interval=0.2)
        report["external unload: back after s"] = round(time.monotonic() - t0, 1)

        # 3. kill -9 of tritonserver under a standalone `serving triton`: no orphaned stubs, a new server
        old, old_stubs = tritonserver(server), stubs(server)
        assert old_stubs
        t0 = time.monotonic()
        old.kill()
        wait_until(lambda: answered_by(url, 2), 30, "answers after tritonserver was killed", interval=0.2)
        report["tritonserver kill -9: back after s"] = round(time.monotonic() - t0, 1)
        assert stack.procs["triton"].poll() is None, "`serving triton` restarts its server, it does not exit"
        assert tritonserver(server).pid != old.pid
        for stub in old_stubs:
            assert not stub.is_running() or stub.status() == psutil.STATUS_ZOMBIE, f"orphaned stub {stub}"
        assert report["tritonserver kill -9: back after s"] <= 15
    finally:
        print("measured:", report)
        stack.stop_all()
