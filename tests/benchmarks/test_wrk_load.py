"""benchmarks/wrk/closed_loop.lua's two kinds of body, as a server receives them: corpus lines POSTed as
JSON, and whole files sent raw with no Content-Type, as ``curl -T`` sends them (the TorchServe benchmark's
load). A real wrk against a small HTTP server that records every request."""
from __future__ import annotations

import http.server
import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import wrk_load
from tests.support.ci import cannot_run


@pytest.fixture()
def server():
    seen: Counter = Counter()

    class Recorder(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen[(self.command, self.headers.get("Content-Type"), body)] += 1
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_POST = do_PUT = answer

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def test_files_go_whole_and_raw_and_lines_go_as_json(server, tmp_path: Path) -> None:
    if not wrk_load.available():
        cannot_run("wrk is missing: run scripts/setup.sh")
    url, seen = server
    files = [tmp_path / "a.bin", tmp_path / "b.png"]
    files[0].write_bytes(b"a\x00b\nc")
    files[1].write_bytes(bytes(range(256)) * 20)
    level = wrk_load.run_files(f"{url}/predictions/m", files, concurrency=1, duration_s=1)
    assert level["requests"] > 0 and level["errors"] == 0
    assert set(seen) == {("PUT", None, f.read_bytes()) for f in files}, "each file whole, as is, no Content-Type"

    seen.clear()
    lines = tmp_path / "bodies"
    docs = [{"a": 1}, {"b": [2, 3]}]
    lines.write_text("".join(json.dumps(d) + "\n" for d in docs))
    assert wrk_load._wrk(f"{url}/serve/m", lines, 1, 1, 10)["requests"] > 0
    assert set(seen) == {("POST", "application/json", json.dumps(d).encode()) for d in docs}
