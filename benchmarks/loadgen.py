"""Closed-loop load generator, run as its own process: ``python -m benchmarks.loadgen ...``.

Closed loop: ``concurrency`` clients each send a request, wait for the answer,
and send the next, so throughput is what the server sustains at that many
requests in flight. It runs apart from the server and from the orchestrator so
neither shares an event loop (or a GIL) with it; on a small box it still shares
the cores, so it reports its own CPU time.

Prints one JSON object (a LevelResult) on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from benchmarks.corpus import read_corpus
from benchmarks.payloads import encode_all


@dataclass
class LoadSpec:
    url: str
    payload: str
    corpus: str
    concurrency: int
    warmup_s: float = 0.0
    duration_s: float = 5.0
    requests: int | None = None
    warmup_requests: int = 0
    timeout_s: float = 60.0
    header: list[str] = field(default_factory=list)  # "Name: value", sent with every request


@dataclass
class Phase:
    """One measured (or discarded) phase: latencies of successes, error count, its wall time."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    issued: int = 0


def parse_headers(lines: list[str]) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in lines)
    return {name.strip(): value.strip() for name, value in pairs}


async def _client(client: httpx.AsyncClient, spec: LoadSpec, bodies: list[bytes], start: int,
                  phase: Phase, stop_at: float | None, limit: int | None) -> None:
    i = start
    headers = {"content-type": "application/json", **parse_headers(spec.header)}
    while True:
        if stop_at is not None and time.perf_counter() >= stop_at:
            return
        if limit is not None:
            if phase.issued >= limit:
                return
        phase.issued += 1
        body = bodies[i % len(bodies)]
        i += spec.concurrency
        t0 = time.perf_counter()
        try:
            resp = await client.post(spec.url, content=body, headers=headers)
            ok = resp.status_code < 300
            error = None if ok else f"HTTP {resp.status_code}: {resp.text[:200]}"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if ok:
            phase.latencies.append(time.perf_counter() - t0)
        else:
            phase.errors += 1
            phase.first_error = phase.first_error or error


async def _phase(client: httpx.AsyncClient, spec: LoadSpec, bodies: list[bytes], offset: int,
                 seconds: float | None, limit: int | None) -> tuple[Phase, float]:
    phase = Phase()
    t0 = time.perf_counter()
    stop_at = t0 + seconds if seconds is not None else None
    await asyncio.gather(*(_client(client, spec, bodies, offset + k, phase, stop_at, limit)
                           for k in range(spec.concurrency)))
    return phase, time.perf_counter() - t0


async def run_load(spec: LoadSpec) -> dict:
    """Warm up, then measure; the measured phase continues where the warm-up left the corpus."""
    bodies = encode_all(spec.payload, read_corpus(spec.corpus))
    limits = httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=spec.timeout_s) as client:
        if spec.requests is not None:
            warm, _ = await _phase(client, spec, bodies, 0, None, spec.warmup_requests)
            cpu0 = _cpu_seconds()
            phase, wall = await _phase(client, spec, bodies, warm.issued, None, spec.requests)
        else:
            warm, _ = await _phase(client, spec, bodies, 0, spec.warmup_s, None)
            cpu0 = _cpu_seconds()
            phase, wall = await _phase(client, spec, bodies, warm.issued, spec.duration_s, None)
        cpu = _cpu_seconds() - cpu0
    return summarize(spec, phase, wall, cpu, warm)


def summarize(spec: LoadSpec, phase: Phase, wall: float, cpu: float, warm: Phase) -> dict:
    lat_ms = np.asarray(phase.latencies) * 1000.0
    pct = (lambda q: float(np.percentile(lat_ms, q))) if len(lat_ms) else (lambda q: float("nan"))
    return {
        "concurrency": spec.concurrency,
        "requests": len(phase.latencies),
        "errors": phase.errors,
        "warmup_errors": warm.errors,
        "warmup_requests": len(warm.latencies),  # answered before the clock: a server's CPU counts them too
        "first_error": phase.first_error or warm.first_error,
        "duration_s": wall,
        "rps": len(phase.latencies) / wall if wall > 0 else 0.0,
        "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
        "mean_ms": float(lat_ms.mean()) if len(lat_ms) else float("nan"),
        "client_cpu_s": cpu, "client": "httpx",
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parse_args(argv: list[str] | None = None) -> LoadSpec:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--payload", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--warmup-s", type=float, default=0.0)
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--warmup-requests", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--header", action="append", default=[], help="'Name: value', sent with every request")
    return LoadSpec(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    spec = parse_args(argv)
    print(json.dumps(_run(run_load(spec))))


def _run(coro):
    """On uvloop when present: the client should cost the shared cores as little as it can."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


if __name__ == "__main__":
    main()
