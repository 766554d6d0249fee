"""``python -m benchmarks.statistics_cost [--results benchmarks/results/full.json]``.

What recording a request's statistics costs, measured as CPU time rather than as
a throughput difference: the statistics-on and -off stacks of ``benchmarks.run``
differ by less than this shared 2-core box's run-to-run noise (the same
configuration moves by about 10% between runs), so their ratio cannot show a 5%
effect either way. Here every step an event takes is timed with CPU clocks:

- ``record()`` on the request path, and the recorder thread's encoding of a batch;
- one POST of a batch to the real statistics service on a loopback socket, with
  its decoding and ingestion into Prometheus metrics and drift windows for the
  tokenizer's three variables (a scalar, an enum and a value), both ends counted.

The per-event total, times a platform variant's measured requests/s over the
cores, is the share of the machine that statistics take at that load: on a
CPU-bound server, the throughput they cost. Prints a table; writes
``results/statistics-cost.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from serving.statistics.events import encode_batch
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.recorder import RecorderConfig, StatisticsRecorder
from serving.statistics.service import create_app
from serving.statistics.transports.embedded import HttpSender
from tests.support.servers import serve_in_thread

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ENDPOINT = "bench"
VARIABLES = [{"name": "tokens", "kind": "scalar", "buckets": [8, 16, 32, 64, 128]},
             {"name": "label", "kind": "enum", "values": ["NEGATIVE", "POSITIVE"]},
             {"name": "score", "kind": "value"}]
SNAPSHOT = {"revision": 1, "endpoints": {ENDPOINT: {"metrics": VARIABLES, "log_freq": 1.0,
                                                    "targets": [{"version": 1}]}}}
FLUSH_S = RecorderConfig().flush_interval_s


def event(i: int) -> dict[str, Any]:
    """What the data plane records for one tokenizer request."""
    return {"endpoint": ENDPOINT, "version": 1, "status": 200, "latency_s": 0.012 + (i % 7) * 1e-3,
            "stages": {"preprocess": 2e-4, "inference": 0.011, "postprocess": 1e-4},
            "custom": {"tokens": 20 + i % 100, "label": ("NEGATIVE", "POSITIVE")[i % 2], "score": 0.5 + (i % 50) / 100}}


class _Discard:
    def send(self, payload: bytes, count: int) -> None: ...
    def failed_events(self) -> int: return 0
    def close(self, timeout: float) -> None: ...


def per_event_record_us(n: int) -> float:
    """``record()`` as the request path calls it (the recorder's thread is not on this clock)."""
    recorder = StatisticsRecorder(_Discard(), RecorderConfig(max_queue=n + 1, flush_interval_s=3600))
    events = [event(i) for i in range(n)]
    t0 = time.thread_time()
    for e in events:
        recorder.record(e)
    cost = (time.thread_time() - t0) / n
    recorder.close(1)
    return cost * 1e6


def per_event_encode_us(batch: int, rounds: int) -> float:
    events = [event(i) for i in range(batch)]
    t0 = time.thread_time()
    for _ in range(rounds):
        encode_batch(events, source="bench:1")
    return (time.thread_time() - t0) / (batch * rounds) * 1e6


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_batch_post_us(batch: int, rounds: int) -> float:
    """One POST of ``batch`` events and its ingestion; sender and service share this process."""
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    pipeline.apply_snapshot(SNAPSHOT)
    payload = encode_batch([event(i) for i in range(batch)], source="bench:1")
    with serve_in_thread(create_app(pipeline, registry)) as url:
        sender = HttpSender(url)
        for _ in range(3):
            sender.send(payload, batch)  # connection and first-sight series
        t0 = _process_cpu()
        for _ in range(rounds):
            sender.send(payload, batch)
        cost = (_process_cpu() - t0) / rounds
        sender.close(1)
    return cost * 1e6


def platform_rates(results: Path) -> list[tuple[str, str, float, int]]:
    """(workload, system, best req/s, worker processes) of the statistics-on platform variants of a run."""
    if not results.exists():
        return []
    data = json.loads(results.read_text())
    rates = []
    for r in data["results"]:
        if r["system"].startswith("platform-") and r["details"].get("statistics") and r["levels"]:
            rates.append((r["workload"], r["system"], max(lv["rps"] for lv in r["levels"]), r["details"]["workers"]))
    return rates


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.statistics_cost", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR / "full.json", help="a benchmarks.run JSON")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    record_us, encode_us = per_event_record_us(50_000), per_event_encode_us(1000, 20)
    rows = []
    for workload, system, rps, workers in platform_rates(args.results):
        # each worker process flushes its own batch every FLUSH_S
        batch = max(1, min(RecorderConfig().max_batch, round(rps / workers * FLUSH_S)))
        post_us = per_batch_post_us(batch, 40)
        total_us = record_us + encode_us + post_us / batch
        rows.append({"workload": workload, "system": system, "rps": rps, "batch": batch, "record_us": record_us,
                     "encode_us": encode_us, "post_per_event_us": post_us / batch, "total_us": total_us,
                     "machine_share": total_us * 1e-6 * rps / cores})
    table = Table(title=f"statistics cost per request ({cores} cores)")
    for col in ("workload", "system", "req/s", "batch", "record µs", "encode µs", "POST+ingest µs/event",
                "total µs", "share of machine"):
        table.add_column(col, justify="left" if col in ("workload", "system") else "right")
    for r in rows:
        table.add_row(r["workload"], r["system"], f"{r['rps']:.1f}", str(r["batch"]), f"{r['record_us']:.1f}",
                      f"{r['encode_us']:.1f}", f"{r['post_per_event_us']:.1f}", f"{r['total_us']:.1f}",
                      f"{r['machine_share']:.2%}")
    Console(width=160).print(table)
    out = {"cores": cores, "flush_interval_s": FLUSH_S, "results": str(args.results), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "statistics-cost.json").write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
