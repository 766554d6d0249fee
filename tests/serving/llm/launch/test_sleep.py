"""Scale to zero on one machine (serving/llm/launch/sleep.py), without vLLM: the "interpreter" is a shell script
that starts a small HTTP server answering ``/health`` and vLLM's metric lines, standing in for vLLM only in
being a process the launcher starts, watches and stops, with a count of finished requests the test sets
(tests/serving/llm/launch/test_sleep_e2e.py runs the real vLLM behind a worker)."""
from __future__ import annotations

import sys

import psutil

from serving.llm.launch.sleep import Sleep
from serving.llm.naming import engine_key
from tests.registry.test_readiness import Clock
from tests.serving.llm.launch.test_launcher_states import launcher
from tests.support.procs import wait_until

KEY = engine_key("tiny", 1, {"dtype": "float32"})
SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, done = int(sys.argv[1]), sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = b"ok" if self.path == "/health" else (
            "vllm:num_requests_running 0\\nvllm:num_requests_waiting 0\\n"
            'vllm:request_success_total{finished_reason="stop"} %s\\n' % open(done).read().strip()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def snapshot(after: int | None, others: bool = False) -> dict:
    options = {"dtype": "float32", **({"scale_to_zero_after_s": after} if after else {})}
    endpoints = {"chat": {"engine": "vllm", "engine_options": options,
                          "targets": [{"model": "tiny", "version": 1, "artifact": "d" * 64}]}}
    if others:  # a second endpoint on the same engine that does not let it sleep
        endpoints["chat2"] = {**endpoints["chat"], "engine_options": {"dtype": "float32"}}
    return {"revision": 1, "endpoints": endpoints}


def fake_vllm(tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    done = tmp_path / "finished"
    done.write_text("0")
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nport=""; prev=""\nfor a in "$@"; do [ "$prev" = "--port" ] && port=$a; prev=$a; done\n'
                      f'exec {sys.executable} {tmp_path / "server.py"} "$port" {done}\n')
    script.chmod(0o755)
    return script, done


def sleepy(tmp_path):
    script, done = fake_vllm(tmp_path)
    clock, cold = Clock(), []
    l = launcher(tmp_path, vllm_python=script)
    l.sleep = Sleep(on_cold_start=lambda key, s: cold.append((key, s)), clock=clock)
    return l, clock, done, cold


def entry(l) -> dict:
    l.tick()
    return l.view()["engines"][KEY]


def test_an_idle_engine_stops_its_processes_and_a_wake_starts_them_with_the_cold_start_measured(tmp_path):
    l, clock, done, cold = sleepy(tmp_path)
    try:
        l.apply(snapshot(60))
        wait_until(lambda: entry(l)["state"] == "ready", 30, "the engine ready")
        pid = l.engines[KEY].replicas[0].proc.pid
        clock.now += 50
        done.write_text("3")  # it finished requests since the last look: active now
        assert entry(l)["state"] == "ready"
        clock.now += 59
        assert entry(l)["state"] == "ready", "59 s idle of 60"
        clock.now += 2
        asleep = entry(l)
        assert asleep == {"url": None, "served_model_name": KEY, "state": "scaled_to_zero", "error": None,
                          "replicas": [], "scale_to_zero_after_s": 60}
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert l.readiness()["engines"][KEY] == {"state": "scaled_to_zero", "waking": False, "replicas": 0,
                                                 "scale_to_zero_after_s": 60, "cold_start_s": None}
        assert l.readiness()["failures"] == {}, "a sleeping engine is not a failure"
        assert entry(l)["state"] == "scaled_to_zero", "it stays asleep: nothing starts it but a wake"

        assert l.wake(KEY) == {"engine": KEY, "state": "starting"}
        assert l.wake(KEY) == {"engine": KEY, "state": "starting"}, "idempotent"
        assert l.wake("nobody:1") is None
        waking = entry(l)
        assert waking["state"] == "starting" and waking["waking"] is True, waking
        clock.now += 7.5
        wait_until(lambda: entry(l)["state"] == "ready", 30, "the engine ready again")
        assert cold == [(KEY, 7.5)] and entry(l)["cold_start_s"] == 7.5
        assert l.engines[KEY].replicas[0].proc.pid != pid
        clock.now += 59
        assert entry(l)["state"] == "ready", "a woken engine gets its whole idle period again"
    finally:
        l.close()


def test_an_engine_sleeps_only_when_every_endpoint_on_it_lets_it(tmp_path):
    l, clock, _, _ = sleepy(tmp_path)
    try:
        l.apply(snapshot(10, others=True))
        wait_until(lambda: entry(l)["state"] == "ready", 30, "the engine ready")
        clock.now += 3600
        assert entry(l)["state"] == "ready" and "scale_to_zero_after_s" not in entry(l)
        assert l.wake(KEY) == {"engine": KEY, "state": "ready"}  # awake already: nothing to do
        assert entry(l)["state"] == "ready"
    finally:
        l.close()
