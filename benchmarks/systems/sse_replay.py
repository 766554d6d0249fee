"""An engine that cannot be the bottleneck: a benchmark harness, not a test fake.

``python -m benchmarks.systems.sse_replay serve --recording F --port P`` answers every streaming
``POST /v1/completions`` (and ``/v1/chat/completions``) with one stream recorded from real vLLM, byte
for byte, each event in its own write as vLLM writes them, as fast as the reader takes them (no pacing:
a GPU serving a small model emits tokens faster than one worker core can relay them, and this emits
them faster still). It also answers ``/health``, ``/v1/models`` and an empty ``/metrics``, which the
worker and vllm-router read. What it answers is never checked against a model: the relay benchmark
(benchmarks/llm_relay_rate.py) measures what passing tokens on costs, not what they say; the platform's
answers are checked against transformers in tests/serving/llm.

``python -m benchmarks.systems.sse_replay record --out F`` makes a recording: it starts vLLM (the CPU
build, its own venv) on the tiny Llama of serving/testmodels_llm, asks for one greedy streaming
completion of ``--max-tokens`` tokens with ``ignore_eos`` and the usage chunk, and saves the response
body as received, with a JSON sidecar saying how it was made.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from aiohttp import web

from benchmarks.procs import REPO, child_env, free_port, stop, wait_http

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
RECORDING = RECORDINGS / "vllm-completion-stream.sse"
SERVED = "tiny"  # the served model name in the recording: the systems in front must ask for it by this name


def events(body: bytes) -> list[bytes]:
    """The recorded body cut after each event's blank line: the writes vLLM made."""
    parts = body.split(b"\n\n")
    return [part + b"\n\n" for part in parts if part]


def app(recording: Path) -> web.Application:
    writes = events(recording.read_bytes())

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for chunk in writes:
            await response.write(chunk)  # waits only when the reader is behind (aiohttp's drain)
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    application = web.Application()
    application.add_routes([web.post("/v1/completions", stream), web.post("/v1/chat/completions", stream),
                            web.get("/health", health), web.get("/v1/models", models),
                            web.get("/metrics", health)])
    return application


def record(out: Path, max_tokens: int) -> None:
    from benchmarks.llm import VLLM_PYTHON
    from serving.settings import LLMSettings
    from serving.testmodels_llm import build_tiny_llama

    with tempfile.TemporaryDirectory(prefix="sse-record-") as tmp:
        model_dir = build_tiny_llama(Path(tmp) / "tiny-llama", max_model_len=1024).path
        port = free_port()
        log = open(Path(tmp) / "vllm.log", "ab")
        engine = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                                   *LLMSettings().vllm_default_args, "--model", str(model_dir),
                                   "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
                                   "--host", "127.0.0.1", "--port", str(port)],
                                  env=child_env({"VLLM_CPU_KVCACHE_SPACE": "1"}), cwd=REPO, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                wait_http(f"http://127.0.0.1:{port}/health", 600, [engine])
            except RuntimeError:
                raise SystemExit("vLLM did not start:\n" + (Path(tmp) / "vllm.log").read_text()[-3000:]) from None
            request = {"model": SERVED, "prompt": "count the ships in the harbour", "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}
            body = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=request, timeout=300).content
            version = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm; print(vllm.__version__)"],
                                     capture_output=True, text=True, env=child_env()).stdout.strip()
        finally:
            stop(engine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(body)
    out.with_suffix(".json").write_text(json.dumps({
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": f"vllm-cpu {version}",
        "model": "serving/testmodels_llm tiny Llama (random weights), float32", "request": request,
        "events": len(events(body)), "bytes": len(body)}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--recording", type=Path, default=RECORDING)
    serve.add_argument("--port", type=int, required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, default=RECORDING)
    rec.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.max_tokens)
        return
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(app(args.recording), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    sys.exit(main())
