"""Closed-loop load from ``wrk`` (Debian's package), for the timed levels.

The Python load generator (``benchmarks.loadgen``) spends about 2 ms of CPU per
request in httpx, which on a 2-core box is CPU taken from the server under test
(~9% of the machine at 75 req/s) and never from the in-process ceiling. wrk, in
C with one thread, costs a few microseconds a request. It runs ``concurrency``
connections that each send the next request as soon as the answer arrives,
cycling through the same corpus bodies, and prints one JSON line (see
``wrk/closed_loop.lua``). Fixed request counts (``--requests``, CI's smoke test)
stay with the Python generator: wrk only runs for a duration.
"""
from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.corpus import read_corpus
from benchmarks.payloads import encode_all

SCRIPT = Path(__file__).resolve().parent / "wrk" / "closed_loop.lua"
MARK = "WRK_RESULT "


def available() -> bool:
    return shutil.which("wrk") is not None


def _wrk(url: str, bodies: Path, concurrency: int, seconds: float, timeout_s: float,
         headers: dict[str, str] | None = None, env: dict[str, str] | None = None) -> dict:
    args = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, math.ceil(seconds))}s", f"--timeout={int(timeout_s)}s",
            *(a for name, value in (headers or {}).items() for a in ("-H", f"{name}: {value}")),
            "-s", str(SCRIPT), url]
    out = subprocess.run(args, capture_output=True, text=True,
                         env={**os.environ, "WRK_BODIES": str(bodies), **(env or {})},
                         timeout=seconds + timeout_s + 30)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(MARK)), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-1000:]}{out.stderr[-1000:]}")
    return json.loads(line[len(MARK):])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_level(url: str, payload: str, corpus: Path, concurrency: int, warmup_s: float, duration_s: float,
              timeout_s: float = 60.0, headers: dict[str, str] | None = None) -> dict:
    """A warm-up run (discarded), then the measured one; a LevelResult as a dict."""
    with tempfile.NamedTemporaryFile("wb", suffix=".bodies", delete=False) as f:
        f.write(b"\n".join(encode_all(payload, read_corpus(corpus))) + b"\n")
    try:
        warm = _wrk(url, Path(f.name), concurrency, warmup_s, timeout_s, headers) if warmup_s > 0 else None
        cpu0 = _children_cpu()
        data = _wrk(url, Path(f.name), concurrency, duration_s, timeout_s, headers)
        cpu = _children_cpu() - cpu0
    finally:
        os.unlink(f.name)
    return _level(concurrency, data, warm, cpu)


def _level(concurrency: int, data: dict, warm: dict | None, cpu: float) -> dict:
    """wrk's figures as a LevelResult dict (benchmarks/results.py)."""
    errors = data["status_errors"] + data["socket_errors"]
    wall = data["duration_us"] / 1e6
    ok = data["requests"] - data["status_errors"]
    return {
        "concurrency": concurrency, "requests": ok, "errors": errors,
        "warmup_errors": 0 if warm is None else warm["status_errors"] + warm["socket_errors"],
        "warmup_requests": 0 if warm is None else warm["requests"] - warm["status_errors"],
        "first_error": f"{errors} wrk errors (status >= 400 or socket)" if errors else None,
        "duration_s": wall, "rps": ok / wall if wall > 0 else 0.0,
        "p50_ms": data["p50_us"] / 1000, "p95_ms": data["p95_us"] / 1000, "p99_ms": data["p99_us"] / 1000,
        "mean_ms": data["mean_us"] / 1000, "client_cpu_s": cpu, "client": "wrk",
    }


def run_files(url: str, files: list[Path], concurrency: int, duration_s: float, timeout_s: float = 60.0,
              method: str = "PUT") -> dict:
    """One closed-loop run whose bodies are whole files sent raw, as ``curl -T FILE`` sends them (PUT, no
    Content-Type; ``WRK_FILES`` in ``wrk/closed_loop.lua``); no warm-up: the caller runs one first, so that it can measure
    the servers' CPU around this run alone. A LevelResult as a dict."""
    with tempfile.NamedTemporaryFile("w", suffix=".files", delete=False) as f:
        f.write("".join(f"{path.resolve()}\n" for path in files))
    try:
        cpu0 = _children_cpu()
        data = _wrk(url, Path(f.name), concurrency, duration_s, timeout_s,
                    env={"WRK_FILES": f.name, "WRK_METHOD": method})
        cpu = _children_cpu() - cpu0
    finally:
        os.unlink(f.name)
    return _level(concurrency, data, None, cpu)
