"""``python -m benchmarks.workers [--repeats 3] [--requests 5000] [--duration-s 10] [--parts protocol,scaling,grpc_scaling]``.

Three measurements of the worker processes, on one stack started as a user starts it
(``serving up --no-triton``, statistics on; endpoints added with ``serving model add``):

- **protocol**: the same W1 and W2 tensors (one corpus text a request, tokenized beforehand)
  over gRPC and over HTTP v2 (binary tensors), both with NVIDIA's clients, 16 clients each with
  its own connection, against the same single worker process; the ratio gRPC / HTTP.
- **scaling**: ``/serve`` at 16 keep-alive connections (wrk for ``--seconds``, else
  benchmarks.loadgen for ``--requests``; a new client process and new connections every run) on W0 (an echo endpoint) and W1
  (tokenizer + onnxruntime), with 1, 2 and 4 worker processes, ``--repeats`` times each, against
  ``serving worker`` as shipped (``connections``: the manager hands each connection to the
  process holding the fewest, serving/worker/handoff.py) and, in the same run, the two ways
  before it: ``kernel`` (``SERVING_WORKER_BALANCE=kernel``, a SO_REUSEPORT socket per process)
  and ``shared`` (the same app under uvicorn's own ``--workers``: one socket shared by every
  process). Each run records how many connections each process held and the CPU each used.
- **grpc_scaling**: W1 tensors over gRPC at 16 connections to 2 and 4 processes, ``connections``
  (relayed to each process's gRPC server) against ``kernel`` (each process's own gRPC socket).

Writes benchmarks/results/workers.json and workers.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from benchmarks import wrk_load
from benchmarks.corpus import read_corpus, write_corpus
from benchmarks.procs import REPO, child_env, free_port, process, wait_http
from benchmarks.systems import platform
from benchmarks.workloads import MAX_LENGTH, prepare

RESULTS = Path(__file__).resolve().parent / "results"
ECHO = Path(__file__).resolve().parent / "systems" / "echo_servers" / "platform_preprocess.py"
CONNECTIONS = 16


def tokenize_corpus(tokenizer_dir: Path, texts: list[str], path: Path) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows = [{k: v for k, v in tok(t, truncation=True, max_length=MAX_LENGTH).items()} for t in texts]
    path.write_text(json.dumps(rows))
    return path


def deploy(env: dict, endpoint: str, workload) -> None:
    if workload is None:
        platform.cli(env, "model", "add", "--endpoint", endpoint, "--engine", "custom", "--preprocess", str(ECHO))
        return
    platform.cli(env, "model", "upload", "--name", endpoint, "--path", str(workload.onnx_path))
    platform.cli(env, "model", "add", "--endpoint", endpoint, "--model", f"{endpoint}:1", "--engine", "onnxruntime",
                 "--tokenizer", str(workload.tokenizer_dir), "--labels", ",".join(workload.labels))


def tensor_level(protocol: str, target: str, endpoint: str, tokens: Path, duration_s: float) -> dict:
    args = [sys.executable, "-m", "benchmarks.tensor_load", "--protocol", protocol, "--target", target,
            "--endpoint", endpoint, "--tokens", str(tokens), "--concurrency", str(CONNECTIONS),
            "--duration-s", str(duration_s)]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=duration_s + 300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


class Sampler:
    """Per worker process: the connections it held on ``port`` at the moment the run held the most
    (one consistent sample), and the CPU time it used during the run."""

    def __init__(self, manager_pid: int, port: int) -> None:
        self.port = port
        manager = psutil.Process(manager_pid)
        self.procs = [c for c in manager.children() if "resource_tracker" not in " ".join(c.cmdline())] or [manager]
        self.cpu0 = {p.pid: sum(p.cpu_times()[:2]) for p in self.procs}
        self.best: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):  # keep-alive connections stay for the whole run
            held = [sum(1 for c in p.net_connections("tcp") if c.laddr and c.laddr.port == self.port
                        and c.status == psutil.CONN_ESTABLISHED) for p in self.procs]
            if sum(held) > sum(self.best):
                self.best = held

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"connections": sorted(self.best, reverse=True),
                "cpu_s": sorted((round(sum(p.cpu_times()[:2]) - self.cpu0[p.pid], 2) for p in self.procs),
                                reverse=True)}


def serve_level(url: str, corpus: Path, requests: int, seconds: float, manager_pid: int, port: int) -> dict:
    """One run at 16 new keep-alive connections: wrk for ``seconds`` when installed (its client costs
    the shared cores little), else the Python generator for ``requests``."""
    sampler = Sampler(manager_pid, port)
    try:
        if wrk_load.available():
            level = wrk_load.run_level(url, "text_json", corpus, CONNECTIONS, 0.0, seconds)
        else:
            args = [sys.executable, "-m", "benchmarks.loadgen", "--url", url, "--payload", "text_json", "--corpus",
                    str(corpus), "--concurrency", str(CONNECTIONS), "--requests", str(requests),
                    "--warmup-requests", "0"]
            out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=900,
                                 check=True)
            level = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        spread = sampler.stop()
    return {"rps": round(level["rps"], 1), "p99_ms": round(level["p99_ms"], 1),
            "errors": level.get("errors", 0), **spread}


def start_workers(env: dict, processes: int, model: str, log_dir: Path, grpc_port: int = 0):
    """``serving worker`` (``connections`` or ``kernel``) or uvicorn's ``--workers`` (one shared socket)."""
    port = free_port()
    extra = {**env, "SERVING_WORKER_PORT": str(port), "SERVING_WORKER_GRPC_PORT": str(grpc_port),
             "SERVING_WORKER_CACHE": str(log_dir / "home" / f"cache-{model}-{processes}.json")}  # fresh each run
    if model in ("connections", "kernel"):
        extra["SERVING_WORKER_BALANCE"] = model
        args = ["-m", "serving.cli.main", "worker", "--workers", str(processes)]
    else:
        args = ["-m", "uvicorn", "serving.worker.main:create_from_env", "--factory", "--port", str(port),
                "--workers", str(processes), "--loop", "uvloop", "--http", "httptools", "--log-level", "warning",
                "--no-access-log"]
    return port, process(args, log_dir / f"worker-{model}-{processes}.log", env=extra)


def scaling(env: dict, log_dir: Path, corpora: dict[str, Path], repeats: int, requests: dict[str, int],
            seconds: float) -> list:
    rows = []
    for processes in (1, 2, 4):
        for model in ("connections", "kernel", "shared") if processes > 1 else ("connections",):
            port, ctx = start_workers(env, processes, model, log_dir)
            with ctx as proc:
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/v2/health/ready", timeout=240, procs=[proc])
                for endpoint in corpora:
                    platform.wait_serving(f"{url}/serve/{endpoint}", {"text": "warm up"}, 180, [proc],
                                          streak=8 * processes)
                    runs = [serve_level(f"{url}/serve/{endpoint}", corpora[endpoint], requests[endpoint],
                                        seconds, proc.pid, port) for _ in range(repeats)]
                    rps = [r["rps"] for r in runs]
                    row = {"workload": endpoint, "processes": processes, "sockets": model, "runs": runs,
                           "rps_min": min(rps), "rps_max": max(rps), "spread": round(max(rps) / min(rps), 2)}
                    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
                    rows.append(row)
    return rows


def grpc_scaling(env: dict, log_dir: Path, tokens: Path, repeats: int, duration_s: float) -> list:
    """W1 tensors over gRPC, 16 connections, per balance: req/s and connections per process."""
    rows = []
    for processes in (2, 4):
        for model in ("connections", "kernel"):
            grpc_port = free_port()
            port, ctx = start_workers(env, processes, model, log_dir, grpc_port=grpc_port)
            with ctx as proc:
                wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout=240, procs=[proc])
                platform.wait_serving(f"http://127.0.0.1:{port}/serve/W1", {"text": "warm up"}, 180, [proc],
                                      streak=8 * processes)
                runs = []
                for _ in range(repeats):
                    sampler = Sampler(proc.pid, grpc_port)
                    try:
                        level = tensor_level("grpc", f"127.0.0.1:{grpc_port}", "W1", tokens, duration_s)
                    finally:
                        spread = sampler.stop()
                    runs.append({"rps": round(level["rps"], 1), "p99_ms": level["p99_ms"],
                                 "errors": level.get("errors", 0), **spread})
            rps = [r["rps"] for r in runs]
            row = {"workload": "W1 gRPC", "processes": processes, "sockets": model, "runs": runs,
                   "rps_min": min(rps), "rps_max": max(rps), "spread": round(max(rps) / min(rps), 2)}
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
            rows.append(row)
    return rows


def protocol(env: dict, worker_port: int, grpc_port: int, tokens: dict[str, Path], duration_s: float) -> list:
    rows = []
    for endpoint, path in tokens.items():
        grpc = tensor_level("grpc", f"127.0.0.1:{grpc_port}", endpoint, path, duration_s)
        http = tensor_level("http", f"127.0.0.1:{worker_port}", endpoint, path, duration_s)
        row = {"workload": endpoint, "grpc": grpc, "http_v2": http,
               "ratio_rps": round(grpc["rps"] / http["rps"], 2) if http["rps"] else None}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=5000, help="per scaling run on W0 (W1: a quarter)")
    p.add_argument("--duration-s", type=float, default=10.0, help="per protocol level")
    p.add_argument("--seconds", type=float, default=5.0, help="per scaling run, with wrk")
    p.add_argument("--parts", default="protocol,scaling,grpc_scaling")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stacks it started, as on Ctrl-C
    parts = set(a.parts.split(","))
    log_dir = RESULTS / "logs" / "workers"
    home = log_dir / "home"
    shutil.rmtree(home, ignore_errors=True)
    from serving.demo import stack_env

    env = {**{k: v for k, v in stack_env(home).items() if k.startswith("SERVING_")},
           **dict.fromkeys(("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN"))}
    w1, w2 = prepare("W1"), prepare("W2")
    corpus = {name: log_dir / f"corpus-{name}.json" for name in ("W1", "W2")}
    for name, wl in (("W1", w1), ("W2", w2)):
        write_corpus(wl.tokenizer_dir, 512, corpus[name])
    corpus["W0"] = corpus["W1"]  # the echo endpoint answers the same texts
    tokens = {name: tokenize_corpus(wl.tokenizer_dir, read_corpus(corpus[name]), log_dir / f"tokens-{name}.json")
              for name, wl in (("W1", w1), ("W2", w2))}
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "load_before": list(psutil.getloadavg()), "cores": psutil.cpu_count()}
    with process(["-m", "serving.cli.main", "up", "--no-triton", "--workers", "1"], log_dir / "up.log",
                 env=env) as up:
        worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
        wait_http(f"{worker}/v2/health/live", timeout=240, procs=[up])
        deploy(env, "W0", None)
        deploy(env, "W1", w1)
        deploy(env, "W2", w2)
        for endpoint in ("W0", "W1", "W2"):
            platform.wait_serving(f"{worker}/serve/{endpoint}", {"text": "warm up"}, 180, [up])
        if "protocol" in parts:
            result["protocol"] = protocol(env, int(env["SERVING_WORKER_PORT"]), int(env["SERVING_WORKER_GRPC_PORT"]),
                                          tokens, a.duration_s)
        if "scaling" in parts:
            result["scaling"] = scaling(env, log_dir, {"W0": corpus["W0"], "W1": corpus["W1"]}, a.repeats,
                                        {"W0": a.requests, "W1": max(300, a.requests // 4)}, a.seconds)
        if "grpc_scaling" in parts:
            result["grpc_scaling"] = grpc_scaling(env, log_dir, tokens["W1"], a.repeats, a.duration_s)
    result["load_after"] = list(psutil.getloadavg())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "workers.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "workers.md").write_text(markdown(result))
    print((RESULTS / "workers.md").read_text())


def markdown(result: dict) -> str:
    lines = [f"Run {result['started']}, {result['cores']} cores, load average before "
             f"{result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}.", ""]
    if result.get("protocol"):
        lines += ["| workload | gRPC req/s | p50 / p99 ms | HTTP v2 req/s | p50 / p99 ms | gRPC / HTTP | client CPU s gRPC / HTTP |",
                  "|---|---|---|---|---|---|---|"]
        for r in result["protocol"]:
            g, h = r["grpc"], r["http_v2"]
            lines.append(f"| {r['workload']} | {g['rps']} | {g['p50_ms']} / {g['p99_ms']} | {h['rps']} | "
                         f"{h['p50_ms']} / {h['p99_ms']} | {r['ratio_rps']} | {g['client_cpu_s']} / {h['client_cpu_s']} |")
        lines.append("")
    rows = result.get("scaling", []) + result.get("grpc_scaling", [])
    if rows:
        lines += ["| workload | processes | balance | req/s per run | max/min | connections per process, each run | "
                  "CPU s per process, each run |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['workload']} | {r['processes']} | {r['sockets']} | "
                         f"{', '.join(str(x['rps']) for x in r['runs'])} | {r['spread']} | "
                         f"{'; '.join('/'.join(map(str, x['connections'])) for x in r['runs'])} | "
                         f"{'; '.join('/'.join(map(str, x['cpu_s'])) for x in r['runs'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
