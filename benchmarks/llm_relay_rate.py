"""``python -m benchmarks.llm_relay_rate [--streams 1,32,128] [--seconds 8] [--passes 2]``: tokens relayed at a
GPU's rate (issue 45, item 2).

What does passing an LLM's tokens on cost the worker, when the engine is never the bottleneck? The engine
here is benchmarks/systems/sse_replay.py, a harness that replays one stream recorded from real vLLM, byte
for byte, as fast as it is read (benchmarks/recordings/). In front of it, one at a time:

- ``direct``: nothing; the driver reads the replayer itself (what the harness can give);
- ``passthrough``: aiohttp in, Starlette's streaming response out, nothing else (systems/sse_passthrough.py):
  the Python ceiling;
- ``vllm-router``: vLLM's own Rust router (``vllm-router`` 0.1.17, ``--policy round_robin``);
- ``worker``: the platform's worker, the endpoint ``--engine vllm --aux-config url=...`` of the replayer,
  statistics on (a statistics service takes every request's event), client keys off.

The load (systems/sse_driver.py) is ``streams`` concurrent streaming completions, one after another on
each, for ``seconds``, at 1, 32 and 128 streams. The relaying process runs alone on core 1; the replayer,
the driver and the rest of the platform share core 0. Each pass measures the CPU time of every process:
CPU per token is a process's CPU over the output tokens of the pass (each stream's usage chunk).
The systems run in ABBA order per level, ``passes`` times, pooled. Writes ``results/llm_relay_rate.json``
and ``.png``; docs/benchmarks.md has the table and what it says.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.llm_relay import cpu_seconds
from benchmarks.procs import REPO, child_env, free_port, stop, wait_http
from benchmarks.systems.sse_replay import RECORDING, SERVED

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SYSTEMS = ("direct", "passthrough", "vllm-router", "worker")
ENDPOINT = "relay"
TARGET_MS, TARGET_RATIO, TARGET_STREAMS = 0.03, 1.3, 32
console = Console(width=150)


class Processes:
    """Every process of the run, by name, each in its own process group, pinned to its core."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.procs = root, env, {}

    def start(self, name: str, args: list[str], core: int) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        self.procs[name] = proc = subprocess.Popen(["taskset", "-c", str(core), *args], env=self.env, cwd=REPO,
                                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return proc

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            try:
                root = psutil.Process(proc.pid)
                out[name] = cpu_seconds([root, *root.children(recursive=True)])
            except psutil.Error:
                out[name] = 0.0
        return out

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            stop(proc)


def start_all(root: Path, recording: Path) -> tuple[Processes, dict[str, tuple[str, str]]]:
    """The replayer, the three relays in front of it, and the platform's control plane and statistics."""
    from serving.demo import stack_env

    env = child_env({**stack_env(root / "home"), "SERVING_CLIENT_KEYS_REQUIRED": "false", "PYTHONUNBUFFERED": "1"})
    procs = Processes(root, env)
    try:
        return procs, _start(procs, env, root, recording)
    except BaseException:
        procs.stop()
        raise


def _start(procs: Processes, env: dict[str, str], root: Path, recording: Path) -> dict[str, tuple[str, str]]:
    from serving.testmodels_llm import build_tiny_llama

    ports = {name: free_port() for name in ("replay", "passthrough", "router")}
    replay = f"http://127.0.0.1:{ports['replay']}"
    python = sys.executable
    procs.start("replayer", [python, "-m", "benchmarks.systems.sse_replay", "serve", "--recording", str(recording),
                            "--port", str(ports["replay"])], 0)
    wait_http(f"{replay}/health", 60, list(procs.procs.values()))
    procs.start("passthrough", [python, "-m", "benchmarks.systems.sse_passthrough", "--upstream", replay,
                                "--port", str(ports["passthrough"])], 1)
    procs.start("vllm-router", [str(Path(python).parent / "vllm-router"), "--worker-urls", replay, "--policy",
                                "round_robin", "--host", "127.0.0.1", "--port", str(ports["router"]),
                                "--log-level", "warning", "--prometheus-port", str(free_port())], 1)
    procs.start("control-plane", [python, "-m", "serving.cli.main", "control-plane"], 0)
    procs.start("statistics", [python, "-m", "serving.cli.main", "statistics"], 0)
    wait_http(f"{env['SERVING_CONTROL_PLANE_URL']}/health", 120, list(procs.procs.values()))
    model = build_tiny_llama(root / "tiny-llm")
    cli = [python, "-m", "serving.cli.main"]
    subprocess.run([*cli, "model", "upload", "--name", "tiny-llm", "--path", str(model.path)], env=env, check=True,
                   capture_output=True, timeout=300)
    subprocess.run([*cli, "model", "add", "--endpoint", ENDPOINT, "--model", "tiny-llm", "--engine", "vllm",
                    "--aux-config", f"url={replay}/v1", f"served_model_name={SERVED}"], env=env, check=True,
                   capture_output=True, timeout=300)
    procs.start("worker", [python, "-m", "serving.cli.main", "worker"], 1)
    worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
    probe = {"model": ENDPOINT, "prompt": "a", "max_tokens": 1, "stream": True}
    wait_http(f"{worker}/serve/openai/v1/completions", 180, list(procs.procs.values()), method="POST", json=probe)
    wait_http(f"http://127.0.0.1:{ports['passthrough']}/v1/completions", 60, list(procs.procs.values()),
              method="POST", json=probe)
    wait_http(f"http://127.0.0.1:{ports['router']}/v1/completions", 60, list(procs.procs.values()),
              method="POST", json=probe)
    systems = {"direct": (f"{replay}/v1/completions", SERVED),
               "passthrough": (f"http://127.0.0.1:{ports['passthrough']}/v1/completions", SERVED),
               "vllm-router": (f"http://127.0.0.1:{ports['router']}/v1/completions", SERVED),
               "worker": (f"{worker}/serve/openai/v1/completions", ENDPOINT)}
    return systems


def one_pass(procs: Processes, url: str, model: str, streams: int, seconds: float) -> tuple[dict, dict[str, float]]:
    """One run of the driver (core 0): its result, and each process's CPU seconds in it, the driver's own
    from the kernel's account of that child (``wait4``)."""
    before = procs.cpu()
    out = procs.root / "driver.out"
    with open(out, "wb") as sink:
        driver = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "benchmarks.systems.sse_driver",
                                   "--url", url, "--model", model, "--streams", str(streams), "--seconds",
                                   str(seconds)], stdout=sink, stderr=subprocess.STDOUT, env=procs.env, cwd=REPO)
        _, status, usage = os.wait4(driver.pid, 0)
    driver.returncode = os.waitstatus_to_exitcode(status)
    if driver.returncode != 0:
        raise SystemExit(f"the driver failed:\n{out.read_text()[-3000:]}")
    after = procs.cpu()
    cpu = {name: after[name] - before.get(name, 0.0) for name in after}
    cpu["driver"] = usage.ru_utime + usage.ru_stime
    return json.loads(out.read_text().strip().splitlines()[-1]), cpu


def relay_process(system: str) -> str | None:
    return {"passthrough": "passthrough", "vllm-router": "vllm-router", "worker": "worker"}.get(system)


def row(system: str, streams: int, passes: list[tuple[dict, dict[str, float]]]) -> dict:
    tokens = sum(p["tokens"] for p, _ in passes)
    wall = sum(p["wall_s"] for p, _ in passes)
    cpu: dict[str, float] = {}
    for _, spent in passes:
        for name, seconds in spent.items():
            cpu[name] = cpu.get(name, 0.0) + seconds
    ttft = sorted(t for p, _ in passes for t in p["ttft_s"])
    relay = relay_process(system)
    return {"system": system, "streams": streams, "passes": len(passes), "tokens": tokens,
            "requests": sum(p["requests"] for p, _ in passes), "errors": sum(p["errors"] for p, _ in passes),
            "tokens_per_s": tokens / wall if wall else 0.0,
            "ttft_p50_ms": 1000 * ttft[len(ttft) // 2] if ttft else None,
            "cpu_ms_per_token": {name: 1000 * s / tokens for name, s in cpu.items()} if tokens else {},
            "relay_ms_per_token": 1000 * cpu[relay] / tokens if relay and tokens else None}


def run(levels: list[int], seconds: float, passes: int, root: Path, recording: Path) -> dict:
    procs, systems = start_all(root, recording)
    rows = []
    try:
        for streams in levels:
            done: dict[str, list] = {s: [] for s in SYSTEMS}
            for i in range(passes):
                for system in (SYSTEMS if i % 2 == 0 else tuple(reversed(SYSTEMS))):
                    url, model = systems[system]
                    done[system].append(one_pass(procs, url, model, streams, seconds))
                    result, cpu = done[system][-1]
                    relay = relay_process(system)
                    console.print(f"{streams:4} streams  {system:12} {result['tokens'] / result['wall_s']:9.0f} tok/s"
                                  + (f"  {1000 * cpu[relay] / result['tokens']:.4f} ms CPU/token in the relay"
                                     if relay and result["tokens"] else ""))
            rows += [row(system, streams, done[system]) for system in SYSTEMS]
    finally:
        procs.stop()
    meta = json.loads(recording.with_suffix(".json").read_text())
    return {"levels": levels, "seconds": seconds, "passes": passes, "recording": meta, "rows": rows,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "targets": {"relay_ms_per_token": TARGET_MS, "of_passthrough": TARGET_RATIO, "at_streams": TARGET_STREAMS}}


def print_table(result: dict) -> None:
    table = Table(title=f"Tokens relayed from a replayed vLLM stream ({result['recording']['events']} events); "
                        f"relays alone on core 1; {result['passes']} passes of {result['seconds']:.0f} s (ABBA)")
    for col in ("streams", "system", "tokens/s", "relay CPU ms/token", "x passthrough", "replayer", "driver",
                "statistics", "TTFT p50 ms", "errors"):
        table.add_column(col)
    by = {(r["streams"], r["system"]): r for r in result["rows"]}
    for r in result["rows"]:
        base = by[(r["streams"], "passthrough")]["relay_ms_per_token"]
        mine = r["relay_ms_per_token"]
        per = r["cpu_ms_per_token"]
        table.add_row(str(r["streams"]), r["system"], f"{r['tokens_per_s']:.0f}",
                      f"{mine:.4f}" if mine is not None else "-",
                      f"{mine / base:.2f}x" if mine is not None and base else "-",
                      f"{per.get('replayer', 0):.4f}", f"{per.get('driver', 0):.4f}",
                      f"{per.get('statistics', 0):.4f}" if r["system"] == "worker" else "-",
                      f"{r['ttft_p50_ms']:.1f}" if r["ttft_p50_ms"] is not None else "-", str(r["errors"]))
    console.print(table)


def plot(result: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    levels = result["levels"]
    for system in SYSTEMS:
        rows = {r["streams"]: r for r in result["rows"] if r["system"] == system}
        left.plot(levels, [rows[s]["tokens_per_s"] for s in levels], marker="o", label=system)
        if system != "direct":
            right.plot(levels, [rows[s]["relay_ms_per_token"] for s in levels], marker="o", label=system)
    right.axhline(TARGET_MS, color="grey", linestyle="--", label=f"target {TARGET_MS} ms")
    for ax, title in ((left, "tokens/s (relay alone on one core)"), (right, "relay CPU ms per token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(s) for s in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_relay_rate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,32,128")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--recording", type=Path, default=RECORDING, help="an SSE body recorded from vLLM")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llm-relay-rate-") as tmp:
        result = run([int(s) for s in args.streams.split(",")], args.seconds, args.passes, Path(tmp), args.recording)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llm_relay_rate.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "llm_relay_rate.png")
    print_table(result)
    return result


if __name__ == "__main__":
    main()
