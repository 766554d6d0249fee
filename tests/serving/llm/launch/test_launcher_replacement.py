"""An engine replaced under the same key (the base's first LoRA adapter turns LoRA on) without a gap:
the old one serves until the new one is ready, then stops once idle (serving/llm/launch/replacement.py).

The "interpreter" here is a small HTTP server standing in for vLLM only in what the launcher reads of
it: ``/health`` (the LoRA-enabled one answers 200 only once the test says so, so that the moment between
the two is held open), ``/metrics`` (requests running, as the test sets them) and the adapter loading
route. tests/serving/llm/test_lora_e2e.py turns LoRA on under traffic on real vLLM.
"""
from __future__ import annotations

import os
import stat
import sys

from serving.llm.naming import engine_key
from tests.serving.llm.launch.test_launcher_states import launcher
from tests.support.procs import wait_until

KEY = engine_key("tiny", 1, {"dtype": "float32"})
LORA = {"lora": {"base": {"name": "tiny", "version": 1, "artifact": "c" * 64}, "rank": 8}}

SERVER = '''
import http.server, pathlib, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
lora = "--enable-lora" in args
box = pathlib.Path(sys.argv[0]).parent / "box"

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def answer(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health":
            self.answer(200 if not lora or (box / "lora-ready").exists() else 503)
        elif self.path == "/metrics":
            running = (box / f"running-{port}").read_text() if (box / f"running-{port}").exists() else "0"
            self.answer(200, f'vllm:num_requests_running{{engine="0"}} {running}\\n'.encode())
        else:
            self.answer(404)
    def do_POST(self):
        self.answer(200, b"{}")

http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def snapshot(revision: int, adapter: bool) -> dict:
    targets = [{"model": "tiny", "version": 1, "artifact": "c" * 64}]
    bot = [{"model": "bot", "version": 1, "artifact": "d" * 64, "signature": LORA}]
    options = {"dtype": "float32"}
    endpoints = {"chat": {"engine": "vllm", "engine_options": options, "targets": targets}}
    if adapter:
        endpoints["bot"] = {"engine": "vllm", "engine_options": options, "targets": bot}
    return {"revision": revision, "endpoints": endpoints}


def stand_in(tmp_path):
    (tmp_path / "box").mkdir()
    (tmp_path / "server.py").write_text(SERVER)
    script = tmp_path / "python"
    # launched as ``python -m vllm...entrypoints.openai.api_server ARGS``: the stand-in takes ARGS
    script.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {tmp_path / "server.py"} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, tmp_path / "box"


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"


def test_lora_turned_on_keeps_the_old_engine_serving_until_the_new_one_is_ready(tmp_path, monkeypatch):
    monkeypatch.setattr("serving.llm.launch.launcher.UNLOAD_GRACE_S", 0.0)
    script, box = stand_in(tmp_path)
    l = launcher(tmp_path, vllm_python=script)
    try:
        l.apply(snapshot(1, adapter=False))
        first = wait_until(lambda: l.tick() or (lambda e: e if e["state"] == "ready" else None)(l.view()["engines"][KEY]),
                           30, "the base's engine ready")
        old = l.engines[KEY].replicas[0]
        old_pid = old.proc.pid

        l.apply(snapshot(2, adapter=True))  # the first adapter: LoRA on, the same key
        wait_until(lambda: l.tick() or l.engines[KEY].replicas[0].proc is not None, 30, "the new engine started")
        new = l.engines[KEY].replicas[0]
        assert new.port != old.port and new.name == f"{KEY}~1" and new.generation == 1
        for _ in range(20):  # the new one is not ready: the map still shows the old one, ready
            l.tick()
            assert l.view()["engines"][KEY]["url"] == first["url"] and l.view()["engines"][KEY]["state"] == "ready"
        # readiness reports the new engine itself (its failure would be one), not the old one serving meanwhile
        assert l.readiness()["engines"][KEY]["state"] == "starting"
        assert alive(old_pid)

        (box / f"running-{old.port}").write_text("1")  # a request still running on the old one
        (box / "lora-ready").write_text("")
        wait_until(lambda: l.tick() or l.view()["engines"][KEY]["url"] == new.url, 30, "the map shows the new one")
        wait_until(lambda: l.tick() or l.view()["engines"][KEY]["replicas"][0]["adapters"] == ["bot:1"], 30,
                   "the adapter loaded into the new one")
        for _ in range(10):
            l.tick()
        assert alive(old_pid), "the old engine drains its running request first"

        (box / f"running-{old.port}").write_text("0")
        wait_until(lambda: l.tick() or not alive(old_pid), 30, "the old engine stopped once idle")
        assert l.replacements.retiring == {} and l.view()["engines"][KEY]["url"] == new.url
    finally:
        l.close()


def test_a_change_to_an_engine_that_never_got_ready_restarts_it_at_once(tmp_path):
    script, box = stand_in(tmp_path)
    (box / "lora-ready").unlink(missing_ok=True)
    l = launcher(tmp_path, vllm_python=script)
    try:
        l.apply(snapshot(1, adapter=True))  # LoRA on from the start, never ready
        wait_until(lambda: l.tick() or l.engines[KEY].replicas[0].proc is not None, 30, "started")
        pid = l.engines[KEY].replicas[0].proc.pid
        l.apply(snapshot(2, adapter=False))  # nothing serves: nothing to keep
        assert l.replacements.retiring == {} and not alive(pid)
    finally:
        l.close()
