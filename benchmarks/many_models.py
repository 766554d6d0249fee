"""``python -m benchmarks.many_models [--models 100] [--budget-mb 1024]``.

Many Triton-engine endpoints on one small machine under the embedded Triton's memory budget
(SERVING_TRITON_MEMORY_BUDGET_MB): real control plane, `serving triton` and one worker on
loopback ports, ``--models`` distinct tiny classifiers (tests/serving/triton/budget_stack.py
makes them: the tiny BERT of the test suite, each with its own classifier bias).

Measured, in one run:

- deployment: seconds until every model is loadable (loaded while there is room, checked with
  onnxruntime and left cold after that);
- a client walking every endpoint once, in order, one request each: every model is cold when
  its turn comes (more models than fit), so each request costs a load: cold first-request
  latency (p50/p90/max), and nothing but 200s whose logits equal onnxruntime's on the same input;
- a hot model: ``--hot`` requests in a row to one loaded model (p50/p99), the baseline the cold
  latency is compared against in the same run;
- memory: the most Triton ever held at once (its repository index, sampled every 0.1 s), the
  stubs' resident memory at its highest (psutil, independently of the loader's accounting), the
  whole Triton process tree at the end, and what the same models would hold without a budget
  (every model loaded with the default instance layout) computed from the measured per-instance
  cost: running that here would take the memory of the other work on this shared machine.

Prints a table; writes ``results/many-models.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.procs import run_threads
from serving.triton.budget import MB
from serving.triton.python_backend import instance_layout
from tests.serving.stack import make_stack
from tests.serving.triton.budget_stack import (
    Watch, deploy, direct_logits, feeds, loader_status, triton_process, v2_body, v2_logits, variants, wait_admitted,
)

RESULTS = Path(__file__).resolve().parent / "results" / "many-models.json"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def tree_rss(pid: int) -> int:
    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def wait_ready(url: str, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = httpx.get(f"{url}/status", timeout=10).json().get("readiness", {})
        if all(states.get(n, {}).get("state") == "ready" for n in names):
            return
        time.sleep(0.5)
    raise TimeoutError("the worker did not see every endpoint ready")


def walk(client: httpx.Client, url: str, names: list[str], wanted: list[np.ndarray], inputs: dict) -> dict:
    """One request per endpoint, in order; latency of each, statuses, wrong answers."""
    latencies, statuses, wrong = [], {}, []
    for k, name in enumerate(names):
        t0 = time.perf_counter()
        r = client.post(f"{url}/v2/models/{name}/infer", json=v2_body(inputs))
        latencies.append(time.perf_counter() - t0)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 200 and not np.allclose(v2_logits(r.json()), wanted[k], atol=1e-4):
            wrong.append(name)
    return {"latencies": latencies, "statuses": statuses, "wrong": wrong}


def hot(client: httpx.Client, url: str, name: str, inputs: dict, n: int) -> list[float]:
    client.post(f"{url}/v2/models/{name}/infer", json=v2_body(inputs))  # make sure it is loaded
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post(f"{url}/v2/models/{name}/infer", json=v2_body(inputs))
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
    return out


def busy(url: str, name: str, inputs: dict, seconds: float, clients: int = 8) -> dict:
    """``clients`` clients sending to one model for ``seconds``: it starts on one instance and the
    loader grows it while busy. Returns statuses and req/s in the first and last quarter."""
    stamps: list[float] = []
    statuses: dict[int, int] = {}
    t_end = time.monotonic() + seconds
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(timeout=120) as client:
            while time.monotonic() < t_end:
                r = client.post(f"{url}/v2/models/{name}/infer", json=v2_body(inputs))
                with lock:
                    stamps.append(time.monotonic())
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    t0 = time.monotonic()
    run_threads(client_loop, clients)
    quarter = seconds / 4
    first = sum(1 for t in stamps if t - t0 < quarter) / quarter
    last = sum(1 for t in stamps if t - t0 >= seconds - quarter) / quarter
    return {"statuses": statuses, "req_s_first_quarter": round(first, 1), "req_s_last_quarter": round(last, 1)}


def triton_stats(http: str, token: str, name: str) -> dict:
    """Seconds Triton counted for the model since it loaded: in its queue, computing, in all."""
    try:
        r = httpx.get(f"http://{http}/v2/models/{name}/stats", headers={"triton-access-token": token}, timeout=10)
        s = r.json()["model_stats"][0]["inference_stats"]
        return {k: round(int(s[k]["ns"]) / 1e9, 2) for k in ("queue", "compute_infer", "success")} | {
            "requests": int(s["success"]["count"])}
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        return {"error": repr(exc)}


def run(models: int, budget_mb: int, hot_n: int, base_onnx: Path | None, busy_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="many-models-"))
    try:
        if base_onnx is None:
            from serving.testmodels import build_bert_classifier

            base_onnx = build_bert_classifier(work / "base").onnx_path
        paths = variants(base_onnx, models, work / "variants")
        inputs = feeds(3)
        wanted = direct_logits(paths, inputs)
        (work / "home").mkdir()
        stack = make_stack(work / "home", workers=1)
        stack.env["SERVING_TRITON_MEMORY_BUDGET_MB"] = str(budget_mb)
        try:
            stack.start_control_plane()
            stack.start_triton()
            stack.start_worker(0)
            t0 = time.monotonic()
            names = deploy(stack, paths)
            deploy_s = time.monotonic() - t0
            admit_s = wait_admitted(stack, names, timeout=1800)
            url = stack.worker_url(0)
            wait_ready(url, names, 120)
            server, http, token = triton_process(stack)
            with Watch(server, http, token) as watch, httpx.Client(timeout=300) as client:
                cold = walk(client, url, names, wanted, inputs)
                hot_lat = hot(client, url, names[-1], inputs, hot_n)
                status = loader_status(stack)
                before = status["models"][f"{names[-1]}_v1"]["instances"]
                busy_run = busy(url, names[-1], inputs, busy_s)
                after = loader_status(stack)["models"][f"{names[-1]}_v1"]["instances"]
                busy_stats = triton_stats(http, token, f"{names[-1]}_v1")
            per_instance = max(m["bytes"] // max(1, m["instances"]) for m in status["models"].values()
                               if m["state"] == "loaded")
            default_instances = instance_layout(1)[0]
            result = {
                "models": models, "budget_mb": budget_mb, "cores": os.cpu_count(),
                "deploy_api_s": round(deploy_s, 1), "admission_s": round(admit_s, 1),
                "walk_statuses": cold["statuses"], "walk_wrong_answers": cold["wrong"],
                "cold_p50_s": round(statistics.median(cold["latencies"]), 3),
                "cold_p90_s": round(percentile(cold["latencies"], 90), 3),
                "cold_max_s": round(max(cold["latencies"]), 3),
                "hot_p50_ms": round(statistics.median(hot_lat) * 1000, 2),
                "hot_p99_ms": round(percentile(hot_lat, 99) * 1000, 2),
                "cold_over_hot_p50": round(statistics.median(cold["latencies"]) / statistics.median(hot_lat), 1),
                "max_models_held": watch.max_held, "models_ever_loaded": len(watch.ever_ready),
                "max_stub_rss_mb": round(watch.max_stub_bytes / MB, 1),
                "loader_used_mb": round(status["used_bytes"] / MB, 1),
                "triton_tree_rss_mb_end": round(tree_rss(stack.procs["triton"].pid) / MB, 1),
                "per_instance_rss_mb": round(per_instance / MB, 1),
                "unbudgeted_estimate_mb": round(models * default_instances * per_instance / MB),
                "unbudgeted_instances_per_model": default_instances,
                "busy_clients": 8, "busy_s": busy_s, "busy_statuses": busy_run["statuses"],
                "busy_instances_before_after": [before, after],
                "busy_req_s_first_last_quarter": [busy_run["req_s_first_quarter"], busy_run["req_s_last_quarter"]],
                "busy_model_triton_stats_s": busy_stats,
                "samples": watch.samples,
            }
        finally:
            stack.stop_all()
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def show(r: dict) -> None:
    table = Table(title=f"{r['models']} Triton endpoints under a {r['budget_mb']} MB model memory budget "
                        f"({r['cores']} cores)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("deploy through the API (s)", r["deploy_api_s"]), ("until all loadable (s)", r["admission_s"]),
        ("walk of all endpoints: statuses", json.dumps(r["walk_statuses"])),
        ("wrong answers (vs onnxruntime)", len(r["walk_wrong_answers"])),
        ("cold first request p50 / p90 / max (s)", f"{r['cold_p50_s']} / {r['cold_p90_s']} / {r['cold_max_s']}"),
        ("hot model p50 / p99 (ms)", f"{r['hot_p50_ms']} / {r['hot_p99_ms']}"),
        ("cold p50 / hot p50", f"{r['cold_over_hot_p50']}x"),
        (f"busy model ({r['busy_clients']} clients, {r['busy_s']:g} s): statuses", json.dumps(r["busy_statuses"])),
        ("busy model: instances before -> after", " -> ".join(map(str, r["busy_instances_before_after"]))),
        ("busy model: req/s first -> last quarter", " -> ".join(map(str, r["busy_req_s_first_last_quarter"]))),
        ("most models held at once", r["max_models_held"]),
        ("stubs' RSS at its highest (MB)", r["max_stub_rss_mb"]),
        ("whole Triton process tree at the end (MB)", r["triton_tree_rss_mb_end"]),
        ("one instance (stub RSS, MB)", r["per_instance_rss_mb"]),
        (f"without a budget ({r['unbudgeted_instances_per_model']} instances a model, computed, MB)",
         r["unbudgeted_estimate_mb"]),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--hot", type=int, default=300, help="requests to one loaded model")
    parser.add_argument("--busy-s", type=float, default=20.0, help="seconds of 8 clients on one model")
    parser.add_argument("--base-onnx", type=Path, default=None, help="classifier to vary (default: build the tiny BERT)")
    args = parser.parse_args()
    result = run(args.models, args.budget_mb, args.hot, args.base_onnx, args.busy_s)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    show(result)


if __name__ == "__main__":
    main()
