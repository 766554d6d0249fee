"""Part 2 of ``benchmarks.prediction_log_cost``: CPU time per logged request, with CPU clocks (the request
path's share and each sink's writer share per record), as ``benchmarks.statistics_cost`` measures."""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.procs import descendants
from benchmarks.prediction_log_plan import endpoint_for, implied_ratio

# --- part 2: CPU clocks ------------------------------------------------------------------------------
W2_ANSWER = {"label": "POSITIVE", "score": 0.5318244695663452, "logits": [-0.06359647959470749, 0.06378860771656036]}


class _Discard:
    name = "discard"

    def write(self, records: list[dict[str, Any]]) -> None: ...
    def close(self) -> None: ...


class _Source:
    def __init__(self, sample: float, endpoint: str) -> None:
        from serving.prediction_log.policy import LogPolicy
        from serving.worker.runtime import Config, EndpointRuntime

        policy = LogPolicy(sample=sample) if sample > 0 else None
        ep = EndpointRuntime(name=endpoint, engine="onnxruntime", processor=None, targets=(), prediction_log=policy)
        self.current = Config(revision=1, endpoints={endpoint: ep})


def _request_ids(n: int) -> list[str]:
    import uuid

    return [str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15) % 2**128, version=4)) for i in range(n)]


def request_path_us(texts: list[str], sample: float, n: int) -> dict[str, float]:
    """CPU µs on the request's thread of what the data plane does for the log: ``start`` (every request),
    the inputs and outputs handed over and ``finish`` (``build`` + ``offer``; a kept request). Per request
    and, with ``sample`` > 0, per logged record."""
    from serving.prediction_log.writer import PredictionLog, WriterConfig
    from serving.worker.lifecycle import RequestStats
    from serving.worker.prediction_capture import PredictionCapture

    endpoint = endpoint_for(sample)
    capture = PredictionCapture(_Source(sample, endpoint))
    capture.log = PredictionLog(_Discard(), WriterConfig(max_queue=n + 1, flush_interval_s=3600))
    bodies = [{"text": texts[i % len(texts)]} for i in range(n)]
    stats = [RequestStats(endpoint, version=1, request_id=rid) for rid in _request_ids(n)]
    t0 = time.thread_time()
    for s, body in zip(stats, bodies):
        s.captured = capture.start(endpoint, s.request_id)
        if s.captured is not None:
            s.captured.inputs = body
            s.captured.outputs = W2_ANSWER
        capture.finish(s, 200)
    cost = (time.thread_time() - t0) / n * 1e6
    logged = capture.log.status()["queued"]
    capture.log.close(0.1)
    return {"sample": sample, "requests": n, "logged": logged, "per_request_us": cost,
            "per_logged_us": cost * n / logged if logged else None}


def w2_records(texts: list[str], n: int) -> list[dict[str, Any]]:
    from serving.prediction_log.policy import LogPolicy
    from serving.prediction_log.record import Captured, build

    policy = LogPolicy(sample=100)
    return [build(Captured(policy, {"text": texts[i % len(texts)]}, W2_ANSWER), request_id=rid, endpoint="w2-log100",
                  version=1, status=200, latency_s=0.35) for i, rid in enumerate(_request_ids(n))]


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proc_cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes from /proc, in seconds (gone ones count 0)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def writer_us(sink: Any, records: list[dict[str, Any]], batch: int, interval_s: float,
              broker_pids: list[int] | None = None) -> dict[str, Any]:
    """CPU µs per record of the writer's side: every thread of this process but this one (the writer's,
    and a Kafka producer's I/O thread), while ``records`` go to ``sink`` in the worker's rhythm: ``batch``
    records offered every ``interval_s`` (the writer's flush interval, so each wake finds about one
    batch), its idle wake-ups and a producer's polls included. A broker on this machine is timed apart
    (``broker_us``): in production it runs elsewhere."""
    from serving.prediction_log.writer import PredictionLog, WriterConfig

    config = WriterConfig(max_queue=len(records) + batch + 1)
    log = PredictionLog(sink, config)
    for r in records[:batch]:  # a first connection, a topic's metadata, a first file
        log.offer(r)
    if not log.flush(30):
        raise RuntimeError(f"the {sink.name} sink did not take the warm-up batch: {log.status()}")
    rest = records[batch:]
    cpu0, main0, broker0, wall0 = _process_cpu(), time.thread_time(), proc_cpu_s(broker_pids or []), time.monotonic()
    for i in range(0, len(rest), batch):
        for r in rest[i:i + batch]:
            log.offer(r)
        time.sleep(interval_s)
    if not log.flush(30):
        raise RuntimeError(f"the {sink.name} sink did not take every batch: {log.status()}")
    wall = time.monotonic() - wall0
    other = (_process_cpu() - cpu0) - (time.thread_time() - main0)
    broker = proc_cpu_s(broker_pids or []) - broker0
    status = log.status()
    log.close(5)
    if status["written"] != len(records) or status["dropped"]:
        raise RuntimeError(f"the {sink.name} sink lost records: {status}")
    n = len(rest)
    return {"sink": sink.name, "batch": batch, "records": n, "writer_us": other / n * 1e6,
            "broker_us": broker / n * 1e6 if broker_pids else None, "wall_s": wall}


def tansu_pids() -> list[int]:
    out = []
    for pid in descendants(os.getpid())[1:]:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tansu":
                out.append(pid)
        except OSError:
            pass
    return out


def cpu_clocks(texts: list[str], rps: float, cores: int, kafka: str | None, tmp: Path, worker_cpu_us: float | None = None,
               requests: int = 20_000, batches: int = 40) -> dict[str, Any]:
    """Part 2: the request path at 0, 10 and 100%, the writer per sink at the batch each share gathers in one
    flush interval at ``rps``, and what they imply: the share of the machine at ``rps`` over ``cores``
    (``implied_ratio``, as ``benchmarks.statistics_cost`` reads it), and, given the worker's own CPU time per
    request with logging off (``worker_cpu_us``, part 1), the throughput ratio of a worker that has the
    CPUs to itself: off's CPU per request over off's plus logging's (``ratio_vs_worker_cpu``)."""
    from serving.prediction_log.sinks.files import RotatingFiles
    from serving.prediction_log.sinks.kafka import KafkaRecords
    from serving.prediction_log.writer import WriterConfig

    flush_s = WriterConfig().flush_interval_s
    path = {s: request_path_us(texts, s, requests) for s in (0, 10, 100)}
    writers: list[dict[str, Any]] = []
    for sample in (10, 100):
        batch = max(1, round(rps * sample / 100 * flush_s))
        records = w2_records(texts, batch * (batches + 1))
        sinks = [RotatingFiles(tmp / f"files-{sample}", "bench")]
        if kafka:
            sinks.append(KafkaRecords(kafka, f"bench-cpu-{sample}-{os.getpid()}"))
        for sink in sinks:
            w = writer_us(sink, records, batch, flush_s, tansu_pids() if sink.name == "kafka" else None)
            writers.append({"sample": sample, **w})
    rows = []
    for w in writers:
        logged_us = path[100]["per_logged_us"] + w["writer_us"]
        # per request of the endpoint: start() on every request, the rest on the logged share
        per_request = (path[w["sample"]]["per_request_us"] - path[0]["per_request_us"]) + w["writer_us"] * w["sample"] / 100
        share, ratio = implied_ratio(per_request, rps, cores)
        rows.append({"variant": f"{w['sink']}-{w['sample']}", **w, "path_per_logged_us": path[100]["per_logged_us"],
                     "total_per_logged_us": logged_us, "added_per_request_us": per_request,
                     "machine_share": share, "implied_ratio": ratio,
                     "ratio_vs_worker_cpu": worker_cpu_us / (worker_cpu_us + per_request) if worker_cpu_us else None})
    return {"rps": rps, "cores": cores, "worker_cpu_us": worker_cpu_us, "flush_interval_s": flush_s,
            "request_path": path, "rows": rows}
