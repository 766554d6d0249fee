"""`serving up`: the whole stack from one command serves a model, and Ctrl-C stops every child."""
from __future__ import annotations

import httpx
import pytest

from tests.serving.stack import make_stack
from tests.support.procs import port_open, wait_until


@pytest.mark.timeout(240)
def test_up_serves_and_ctrl_c_stops_everything(tmp_path, tiny_model):
    stack = make_stack(tmp_path / "home", workers=1)
    try:
        stack.up(workers=2)
        stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        stack.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--tokenizer", str(tiny_model.tokenizer_dir))
        url = f"{stack.worker_url()}/serve/clf"
        wait_until(lambda: httpx.post(url, json={"text": "hello"}, timeout=10).status_code == 200, 60, "clf answers")
        # the LLM launcher is one of the children (no vllm endpoint: no engine)
        assert httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json() == {"engines": {}}
    finally:
        code = stack.interrupt()
    assert code == 0, stack.log("up").read_text()[-2000:]
    still_open = [name for name, port in stack.ports().items() if port_open(port)]
    assert still_open == [], f"ports still served after Ctrl-C: {still_open}"
