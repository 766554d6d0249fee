"""``python -m benchmarks.client_keys_cost [--rounds 10] [--requests 2000]``.

What checking a client key costs a request, measured as CPU time: the W0 pair of
``benchmarks.run`` (``platform-echo-1w`` against ``platform-echo-1w-keys``) moves by more than
the effect on this shared 2-core box (the same pair gave 0.66x and 2.3x in two runs of one
evening), so here the two are compared inside one process, interleaved:

- the check alone (``ClientKeys.check_authorization``: header, sha256, scope, token bucket), keys
  required and not;
- a whole ``POST /serve/echo`` through the worker's ASGI app (the W0 echo endpoint, user code and
  all, statistics recorded into a discarding recorder), once with keys required and a scoped,
  rate-limited key, once without; ``rounds`` alternating blocks of ``requests`` each (which goes
  first alternates too), CPU time per request from the median block of each.

Prints a table; writes ``results/client-keys-cost.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from registry.artifacts import ArtifactStore
from serving.credentials import secret_sha256
from serving.settings import WorkerSettings
from serving.worker.app import create_app
from serving.worker.client_keys import ClientKeys

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ECHO = Path(__file__).resolve().parent / "systems" / "echo_servers" / "platform_preprocess.py"
KEY = "sk_" + "5e" * 32
KEYS = {"bench": {"sha256": secret_sha256(KEY), "endpoints": ["echo"], "rate": 1e6, "burst": 1_000_000}}
BODY = b'{"text": "a short sentence to echo back"}'


class _Discard:
    def record(self, event: dict[str, Any]) -> None: ...


def check_cost(required: bool, calls: int = 200_000) -> float:
    """CPU microseconds of one check, best of 5 blocks."""
    keys = ClientKeys(required=required)
    keys.apply_snapshot({"client_keys": KEYS})
    header, best = f"Bearer {KEY}", float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(calls):
            keys.check_authorization(header, "echo")
        best = min(best, time.process_time() - t0)
    return best / calls * 1e6


def snapshot(home: Path) -> dict[str, Any]:
    sha = ArtifactStore(home / "artifacts").put_file(ECHO)[0]
    echo = {"name": "echo", "engine": "custom", "preprocess": {"kind": "user", "artifact": sha, "options": {}},
            "targets": [], "metrics": [], "log_freq": 1.0, "batching": {}}
    return {"revision": 1, "endpoints": {"echo": echo}, "client_keys": KEYS}


async def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/serve/echo", "raw_path": b"/serve/echo", "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 9090)}
    sent = False
    status = [0]

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]

    await app(scope, receive, send)
    return status[0]


async def request_cost(rounds: int, requests: int) -> dict[str, list[float]]:
    """CPU microseconds per request of each block, keys on and off interleaved."""
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    apps: dict[str, tuple[Any, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        snap = snapshot(home)
        contexts = []
        for name, required, headers in (("off", False, base),
                                        ("on", True, [*base, (b"authorization", f"Bearer {KEY}".encode())])):
            app = create_app(WorkerSettings(home=home, artifact_dir=home / "artifacts", statistics_enabled=False,
                                            control_plane_url="http://127.0.0.1:9", client_keys_required=required),
                             snapshot=snap, recorder=_Discard())
            context = app.router.lifespan_context(app)
            await context.__aenter__()
            contexts.append(context)
            apps[name] = (app, headers)
        blocks: dict[str, list[float]] = {"off": [], "on": []}
        try:
            for name, (app, headers) in apps.items():  # warm-up: user code, first-call paths
                assert await _call(app, headers) == 200, f"keys {name}: the echo did not answer 200"
            for r in range(rounds):
                order = list(apps.items())
                for name, (app, headers) in order if r % 2 == 0 else order[::-1]:  # no side always second
                    t0 = time.process_time()
                    for _ in range(requests):
                        await _call(app, headers)
                    blocks[name].append((time.process_time() - t0) / requests * 1e6)
        finally:
            for context in contexts:
                await context.__aexit__(None, None, None)
    return blocks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--requests", type=int, default=2000)
    args = p.parse_args(argv)
    check = {"on": check_cost(True), "off": check_cost(False)}
    blocks = asyncio.run(request_cost(args.rounds, args.requests))
    median = {k: statistics.median(v) for k, v in blocks.items()}
    result = {"check_us": check, "request_cpu_us": median, "blocks_us": blocks,
              "request_ratio_on_over_off": median["on"] / median["off"],
              "added_us": median["on"] - median["off"], "rounds": args.rounds, "requests": args.requests}
    table = Table(title="client keys: CPU time per request (one process, interleaved)")
    for col in ("", "keys off", "keys on", "on - off", "on / off"):
        table.add_column(col)
    table.add_row("check alone (us)", f"{check['off']:.2f}", f"{check['on']:.2f}", f"{check['on'] - check['off']:.2f}", "")
    table.add_row("POST /serve/echo (us, median block)", f"{median['off']:.1f}", f"{median['on']:.1f}",
                  f"{result['added_us']:.1f}", f"{result['request_ratio_on_over_off']:.3f}")
    Console().print(table)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "client-keys-cost.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
