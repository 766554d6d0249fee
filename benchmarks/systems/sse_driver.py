"""The load of the relay benchmark: ``streams`` concurrent streaming completions, one after another on
each, for ``seconds``; prints one JSON line (tokens, requests, errors, wall time, TTFTs).

``python -m benchmarks.systems.sse_driver --url URL --model M --streams N --seconds S``

Kept cheap, because on a 2-core box its CPU is taken from what it measures: a stream's bytes are not
parsed; its tokens are the ``completion_tokens`` of its usage chunk (the one event parsed), its time to
first token the time to its first bytes, and it counts only if it ends with ``data: [DONE]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import orjson

DONE = b"data: [DONE]\n\n"
USAGE = b'"usage":{'


def usage_tokens(tail: bytes) -> int:
    """``completion_tokens`` of the last event that carries usage, from the end of a stream."""
    at = tail.rfind(USAGE)
    start = tail.rfind(b"data: ", 0, at) + len(b"data: ")
    event = orjson.loads(tail[start:tail.index(b"\n", at)])
    return int(event["usage"]["completion_tokens"])


async def one(session: aiohttp.ClientSession, url: str, body: bytes, totals: dict) -> None:
    t0 = time.perf_counter()
    first, tail = None, b""
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        if response.status != 200:
            await response.read()
            totals["errors"] += 1
            return
        async for data, _ in response.content.iter_chunks():
            if first is None:
                first = time.perf_counter() - t0
            tail = (tail + data)[-4096:]
    if not tail.endswith(DONE) or USAGE not in tail:
        totals["errors"] += 1
        return
    totals["tokens"] += usage_tokens(tail)
    totals["requests"] += 1
    totals["ttft_s"].append(first)


async def drive(url: str, model: str, streams: int, seconds: float, max_tokens: int) -> dict:
    body = orjson.dumps({"model": model, "prompt": "count the ships in the harbour", "max_tokens": max_tokens,
                         "temperature": 0, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}})
    totals = {"tokens": 0, "requests": 0, "errors": 0, "ttft_s": []}
    connector = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        await one(session, url, body, {"tokens": 0, "requests": 0, "errors": 0, "ttft_s": []})  # warm up
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                await one(session, url, body, totals)

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(streams)))
        totals["wall_s"] = time.perf_counter() - t0
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(drive(args.url, args.model, args.streams, args.seconds, args.max_tokens))))


if __name__ == "__main__":
    main()
