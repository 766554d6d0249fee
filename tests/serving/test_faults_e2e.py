"""Triton going away and coming back, with real processes: a clean 503 at once, recovery without restart."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.serving.stack import make_stack
from tests.serving.test_stack_e2e import endpoint_ready
from tests.support.procs import wait_until


@pytest.mark.timeout(240)
def test_triton_down_gives_503_with_retry_after_then_recovers(tmp_path, tiny_model):
    stack = make_stack(tmp_path, workers=1)
    try:
        stack.start_control_plane()
        stack.start_triton()
        stack.start_worker(0)
        stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        stack.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--tokenizer", str(tiny_model.tokenizer_dir))
        endpoint_ready(stack, "clf")
        url = f"{stack.worker_url(0)}/serve/clf"
        assert httpx.post(url, json={"text": "fine"}, timeout=30).status_code == 200

        stack.stop("triton")
        t0 = time.monotonic()
        r = httpx.post(url, json={"text": "fine"}, timeout=30)
        assert r.status_code == 503, r.text
        assert "Triton" in r.json()["error"] and int(r.headers["Retry-After"]) >= 1
        assert time.monotonic() - t0 < 10, "a dead Triton must fail fast, not hang"
        assert httpx.get(f"{stack.worker_url(0)}/v2/models/clf/ready", timeout=10).status_code == 503

        stack.start_triton()  # same ports; the worker is not restarted
        wait_until(lambda: httpx.post(url, json={"text": "fine"}, timeout=30).status_code == 200, 60,
                   "the worker serves again once Triton is back")
    finally:
        stack.stop_all()
