"""Parts 1 and 3 of ``benchmarks.prediction_log_cost``: real worker processes under W2 load (the
interleaved throughput runs), and the sink-down check read from a worker's ``GET /status``."""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

from benchmarks import wrk_load
from benchmarks.prediction_log_cpu import proc_cpu_s, tansu_pids
from benchmarks.prediction_log_plan import (BASELINE, CONCURRENCY, EXTRA_DOWN_REQUESTS, MAX_QUEUE_DOWN, PAYLOAD, addresses,
                                            console, drop_check, endpoint_for, resolve_env, schedule, worker_groups)
from benchmarks.procs import descendants, free_port, process, wait_http
from benchmarks.workloads import prepare

# --- parts 1 and 3: real workers ---------------------------------------------------------------------
@dataclass
class Worker:
    key: str
    env: dict[str, str]     # the variants' own environment, addresses filled in
    url: str
    proc: subprocess.Popen
    samples: tuple[float, ...]  # the sample shares its variants use: the only endpoints it is sent requests
    log_dir: Path               # the files sink's folder

    def pids(self) -> list[int]:
        return descendants(self.proc.pid)

    def answered(self, endpoint: str) -> int:
        """Requests the endpoint's version 1 answered or failed in this worker (Triton's statistics)."""
        stats = httpx.get(f"{self.url}/v2/models/{endpoint}/versions/1/stats", timeout=10).json()
        row = stats["model_stats"][0]["inference_stats"]
        return int(row["success"]["count"]) + int(row["fail"]["count"])

    def status(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/status", timeout=10).json()


def _cli(env: dict[str, str | None], *args: str) -> None:
    from benchmarks.systems.platform import cli

    cli(env, *args)


def base_env(home: Path) -> dict[str, str | None]:
    """A fresh control plane's environment (the demo's recipe), statistics and client keys off."""
    from serving.demo import stack_env as demo_env

    env = demo_env(home)
    env = {k: v for k, v in env.items() if k.startswith("SERVING_")}
    env.update({"SERVING_STATISTICS_ENABLED": "false", "SERVING_CLIENT_KEYS_REQUIRED": "false"})
    return {**env, **dict.fromkeys(("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN"))}


@contextmanager
def stack(variants: list[dict[str, Any]], where: dict[str, str], home: Path) -> Iterator[dict[str, Worker]]:
    """A control plane, the W2 model on one endpoint per sample share, and one worker per environment.
    Yields variant name -> its worker."""
    wl = prepare("W2")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = base_env(home)
    groups = worker_groups(variants)
    with ExitStack() as stop:
        cp = stop.enter_context(process(["-m", "serving.cli.main", "control-plane"], home / "control-plane.log", env))
        wait_http(f"{env['SERVING_CONTROL_PLANE_URL']}/health", 120, [cp])
        _cli(env, "model", "upload", "--name", "bench-w2", "--path", str(wl.onnx_path))
        for sample in sorted({v["sample"] for v in variants}):
            endpoint = endpoint_for(sample)
            _cli(env, "model", "add", "--endpoint", endpoint, "--model", "bench-w2:1", "--tokenizer",
                 str(wl.tokenizer_dir), "--labels", ",".join(wl.labels), "--engine", "onnxruntime")
            if sample > 0:
                _cli(env, "endpoint", "log", "--endpoint", endpoint, "--sample", f"{sample:g}%")
        workers: dict[str, Worker] = {}
        for i, (key, names) in enumerate(groups.items()):
            extra = resolve_env(json.loads(key), where)
            port = free_port()
            wenv = {**env, "SERVING_WORKER_PORT": str(port), "SERVING_WORKER_GRPC_PORT": "0",
                    "SERVING_PREDICTION_LOG_DIR": str(home / f"predictions-{i}"), **extra}
            proc = stop.enter_context(process(["-m", "serving.cli.main", "worker", "--workers", "1"],
                                              home / f"worker-{i}.log", wenv))
            samples = tuple(sorted({v["sample"] for v in variants if v["name"] in names}))
            w = Worker(key, extra, f"http://127.0.0.1:{port}", proc, samples, home / f"predictions-{i}")
            for name in names:
                workers[name] = w
        from benchmarks.systems.platform import wait_serving

        for w in {id(w): w for w in workers.values()}.values():
            wait_http(f"{w.url}/v2/health/live", 240, [w.proc])
            # only the endpoints its variants use: a request elsewhere (a 10% endpoint's) would be logged
            # or not by its id's hash, and the sink-down counts could no longer be told exactly
            for sample in w.samples:
                wait_serving(f"{w.url}/serve/{endpoint_for(sample)}", {"text": "warm up the endpoint"}, 240, [w.proc])
        yield workers


def one_run(worker: Worker, endpoint: str, corpus: Path, warmup_s: float, duration_s: float,
            broker_pids: list[int]) -> dict[str, Any]:
    """A discarded warm-up, then the measured run, with the worker's CPU and answered count around it."""
    url = f"{worker.url}/serve/{endpoint}"
    if warmup_s > 0:
        wrk_load.run_level(url, PAYLOAD, corpus, CONCURRENCY, 0, warmup_s)
        time.sleep(0.3)  # the warm-up's last requests end before the clocks are read
    pids = worker.pids()
    n0, cpu0, broker0 = worker.answered(endpoint), proc_cpu_s(pids), proc_cpu_s(broker_pids)
    level = wrk_load.run_level(url, PAYLOAD, corpus, CONCURRENCY, 0, duration_s)
    time.sleep(0.3)  # requests in flight when wrk stopped still end (and are logged)
    n1, cpu1, broker1 = worker.answered(endpoint), proc_cpu_s(pids), proc_cpu_s(broker_pids)
    answered = n1 - n0
    if answered <= 0 or level["requests"] == 0:
        raise RuntimeError(f"{url} answered nothing in {duration_s:g} s: {level.get('first_error')}")
    return {"rps": level["rps"], "p50_ms": level["p50_ms"], "p99_ms": level["p99_ms"], "requests": level["requests"],
            "errors": level["errors"], "answered": answered,
            "worker_cpu_us": (cpu1 - cpu0) / answered * 1e6, "broker_cpu_us": (broker1 - broker0) / answered * 1e6}


def _offered(worker: Worker) -> tuple[int, int]:
    """(requests to the worker's endpoints that log every request, requests to those that log a share)."""
    full = sum(worker.answered(endpoint_for(s)) for s in worker.samples if s >= 100)
    partial = sum(worker.answered(endpoint_for(s)) for s in worker.samples if 0 < s < 100)
    return full, partial


def sink_down_check(worker: Worker, endpoint: str, off: Worker, off_endpoint: str, extra: int) -> dict[str, Any]:
    """After the rounds: the counts against the requests the worker answered; then ``extra`` more, one at a
    time, each followed by one to ``off`` (so the two latencies share the machine's moment), and the counts again."""
    time.sleep(0.5)
    full, partial = _offered(worker)
    before = drop_check(worker.status()["prediction_log"], full, MAX_QUEUE_DOWN, partial)
    ms: dict[str, list[float]] = {"down": [], "off": []}
    codes: list[int] = []
    with httpx.Client(timeout=30) as client:
        for i in range(extra):
            for side, url in (("down", f"{worker.url}/serve/{endpoint}"), ("off", f"{off.url}/serve/{off_endpoint}")):
                t0 = time.perf_counter()
                resp = client.post(url, json={"text": f"one more request, number {i}"})
                ms[side].append((time.perf_counter() - t0) * 1000)
                if side == "down":
                    codes.append(resp.status_code)
    full, partial = _offered(worker)
    after = drop_check(worker.status()["prediction_log"], full, MAX_QUEUE_DOWN, partial)
    return {"after_rounds": before, "after_extra": after, "extra_requests": extra,
            "extra_ok": sum(c == 200 for c in codes),
            "extra_added_dropped": (after["dropped"] or 0) - (before["dropped"] or 0),
            "one_by_one_median_ms": {k: statistics.median(v) for k, v in ms.items()},
            "one_by_one_ratio": statistics.median(ms["down"]) / statistics.median(ms["off"])}


def delivered(worker: Worker) -> dict[str, Any] | None:
    """What a live sink holds, by endpoint, against what the worker answered: every request of a 100%
    endpoint once (Kafka is at least once: copies are counted apart), about the share of a sampled one."""
    sink = worker.env.get("SERVING_PREDICTION_LOG_SINK", "files")
    if sink == "files":
        from serving.prediction_log.sources import file_records

        records = list(file_records(worker.log_dir))
    elif sink == "kafka":
        from serving.prediction_log.sources import kafka_records

        records = list(kafka_records(worker.env["SERVING_KAFKA_BOOTSTRAP_SERVERS"],
                                     worker.env.get("SERVING_PREDICTION_LOG_TOPIC", "serving-predictions")))
    else:
        return None
    status = worker.status()["prediction_log"]
    out: dict[str, Any] = {"sink": sink, "status": status, "records": len(records), "endpoints": {}}
    for sample in worker.samples:
        endpoint = endpoint_for(sample)
        mine = [r for r in records if r.get("endpoint") == endpoint]
        ids = {r.get("request_id") for r in mine}
        answered = worker.answered(endpoint)
        out["endpoints"][endpoint] = {"sample": sample, "answered": answered, "records": len(mine),
                                      "distinct": len(ids), "kept_share": len(ids) / answered if answered else None}
    full = [e for e in out["endpoints"].values() if e["sample"] >= 100]
    out["exact"] = status["written"] == len(records) and status["dropped"] == 0 and all(
        e["distinct"] == e["answered"] for e in full)
    return out


def throughput(variants: list[dict[str, Any]], rounds: int, warmup_s: float, duration_s: float, kafka: str, otlp: str,
               corpus: Path, home: Path) -> dict[str, Any]:
    where = addresses(kafka, otlp)
    for v in variants:  # a variant naming an address nobody gives fails here, before anything starts
        resolve_env(v["env"], where)
    by_name = {v["name"]: v for v in variants}
    plan = schedule([v["name"] for v in variants], rounds)
    runs: list[dict[str, Any]] = []
    broker = tansu_pids()
    with stack(variants, where, home) as workers:
        console.print(f"stack up: {len({id(w) for w in workers.values()})} workers; {len(plan)} runs of "
                      f"{warmup_s:g} + {duration_s:g} s")
        for i, (r, name) in enumerate(plan):
            v = by_name[name]
            run = {"round": r, "variant": name, **one_run(workers[name], endpoint_for(v["sample"]), corpus,
                                                           warmup_s, duration_s, broker)}
            runs.append(run)
            console.print(f"  [{i + 1}/{len(plan)}] round {r} {name}: {run['rps']:.1f} req/s, p99 {run['p99_ms']:.0f} ms, "
                          f"worker {run['worker_cpu_us'] / 1000:.2f} ms CPU/request, {run['errors']} errors")
        down = {}
        for v in variants:
            if v.get("sink_down"):
                down[v["name"]] = sink_down_check(workers[v["name"]], endpoint_for(v["sample"]), workers[BASELINE],
                                                  endpoint_for(by_name[BASELINE]["sample"]), EXTRA_DOWN_REQUESTS)
        time.sleep(0.5)  # the writers' last flush interval
        sinks = {}
        for w in {id(w): w for w in workers.values()}.values():
            if not any(by_name[n].get("sink_down") for n, x in workers.items() if x is w):
                sinks[", ".join(n for n, x in workers.items() if x is w)] = delivered(w)
    return {"runs": runs, "sink_down": down, "delivered": sinks}
