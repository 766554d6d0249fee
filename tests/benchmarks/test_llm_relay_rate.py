"""benchmarks.llm_relay_rate's harness: the replayer gives back the stream recorded from real vLLM byte for
byte, the pass-through and vllm-router hand the same bytes on, the driver counts a stream's tokens from its
usage chunk, and the report's CPU per token and ratios. Real processes on loopback sockets; the benchmark's
figures are not checked here (benchmarks/results/llm_relay_rate.json holds them)."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from benchmarks import llm_relay_rate
from benchmarks.procs import REPO, child_env, free_port, stop, wait_http
from benchmarks.systems import sse_driver
from benchmarks.systems.sse_replay import RECORDING, SERVED, events
from tests.support.ci import cannot_run

REQUEST = {"model": SERVED, "prompt": "a", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@pytest.fixture(scope="module")
def relays():
    router = Path(sys.executable).parent / "vllm-router"
    if not router.exists() and shutil.which("vllm-router") is None:
        cannot_run("vllm-router is not installed: run `make setup` (the bench extra)")
    ports = [free_port() for _ in range(3)]
    replay = f"http://127.0.0.1:{ports[0]}"
    procs = [spawn([sys.executable, "-m", "benchmarks.systems.sse_replay", "serve", "--port", str(ports[0])])]
    try:
        wait_http(f"{replay}/health", 60, procs)
        procs.append(spawn([sys.executable, "-m", "benchmarks.systems.sse_passthrough", "--upstream", replay,
                            "--port", str(ports[1])]))
        procs.append(spawn([str(router), "--worker-urls", replay, "--policy", "round_robin", "--host", "127.0.0.1",
                            "--port", str(ports[2]), "--log-level", "warning",
                            "--prometheus-port", str(free_port())]))
        urls = {"direct": replay, "passthrough": f"http://127.0.0.1:{ports[1]}",
                "vllm-router": f"http://127.0.0.1:{ports[2]}"}
        for url in urls.values():
            wait_http(f"{url}/v1/completions", 60, procs, method="POST", json=REQUEST)
        yield urls
    finally:
        for proc in procs:
            stop(proc)


def test_the_recording_is_a_whole_vllm_stream_with_its_usage_chunk():
    body = RECORDING.read_bytes()
    chunks = events(body)
    assert b"".join(chunks) == body and chunks[-1] == b"data: [DONE]\n\n"
    last = orjson.loads(chunks[-2].removeprefix(b"data: "))
    texts = [orjson.loads(c.removeprefix(b"data: "))["choices"][0]["text"] for c in chunks[:-2]]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(texts) == sse_driver.usage_tokens(body)
    assert all(orjson.loads(c.removeprefix(b"data: "))["model"] == SERVED for c in chunks[:-1])


@pytest.mark.parametrize("system", ["direct", "passthrough", "vllm-router"])
def test_every_relay_hands_on_the_recorded_bytes_unchanged(relays, system):
    with httpx.stream("POST", f"{relays[system]}/v1/completions", json=REQUEST, timeout=30) as response:
        assert response.status_code == 200
        got = b"".join(response.iter_bytes())
    assert got == RECORDING.read_bytes()


def test_the_driver_counts_each_whole_streams_tokens_from_its_usage(relays):
    result = asyncio.run(sse_driver.drive(f"{relays['passthrough']}/v1/completions", SERVED, 2, 0.5, 8))
    assert result["errors"] == 0 and result["requests"] >= 2
    assert result["tokens"] == result["requests"] * sse_driver.usage_tokens(RECORDING.read_bytes())
    assert len(result["ttft_s"]) == result["requests"] and result["wall_s"] >= 0.5


def test_cpu_per_token_is_the_relays_own_and_the_table_gives_ratios_to_the_pass_through(capsys):
    def passes(relay: str | None, seconds: float) -> list:
        cpu = {"replayer": 0.5, "driver": 0.25} | ({relay: seconds} if relay else {})
        return [({"tokens": 10_000, "wall_s": 1.0, "requests": 40, "errors": 0, "ttft_s": [0.001, 0.002]}, cpu)] * 2

    rows = [llm_relay_rate.row("direct", 32, passes(None, 0)),
            llm_relay_rate.row("passthrough", 32, passes("passthrough", 0.2)),
            llm_relay_rate.row("vllm-router", 32, passes("vllm-router", 0.1)),
            llm_relay_rate.row("worker", 32, passes("worker", 0.25))]
    assert rows[1]["relay_ms_per_token"] == pytest.approx(0.02)
    assert rows[3]["relay_ms_per_token"] == pytest.approx(0.025)
    assert rows[0]["relay_ms_per_token"] is None and rows[0]["tokens_per_s"] == 10_000
    assert rows[3]["cpu_ms_per_token"]["replayer"] == pytest.approx(0.05)
    llm_relay_rate.print_table({"recording": {"events": 258}, "passes": 2, "seconds": 8, "rows": rows})
    out = capsys.readouterr().out
    assert "1.25x" in out and "0.50x" in out and "0.0250" in out
