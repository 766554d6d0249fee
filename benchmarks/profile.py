"""``python -m benchmarks.profile [--workload W2] [--system platform-ort-1w] [--seconds 10]``.

Where the CPU goes while a system serves at full load: it starts the system as
the benchmark does, drives it with the same closed-loop client, and meanwhile
(1) reads every process's CPU time from /proc (server processes by role, the
load client, the rest of the box), and (2) samples the Python stacks of the
server processes with py-spy. Prints a summary and writes it to
``results/profile-<workload>-<system>.txt``, with py-spy's collapsed stacks beside it
(``.raw``, which speedscope.app and flamegraph.pl read as they are).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

from benchmarks import corpus as corpus_mod
from benchmarks.modes import resolve
from benchmarks.run import RESULTS_DIR, SYSTEMS, load_level, select_variants
from benchmarks.systems.base import RunContext, Target
from benchmarks.workloads import prepare

TICK = os.sysconf("SC_CLK_TCK")
# Stack frames -> what part of the serving path they are (first match wins, innermost first).
STAGES = (("inference (onnxruntime)", ("InferenceSession.run", "onnxruntime")),
          ("Triton client (gRPC)", ("tritonclient", "grpc")),
          # not "multiprocessing/" alone: every uvicorn worker process starts in multiprocessing.spawn
          ("PyTriton proxy (embedded Triton)", ("pytriton", "multiprocessing/connection", "zmq")),
          ("tokenize", ("tokenizers", "encode", "preprocess/tokenizer")),
          ("statistics", ("serving/statistics/",)),
          ("user code and its threads", ("preprocess/user_code", "concurrent/futures")),
          ("JSON", ("orjson", "json_response", "read_json")),
          ("HTTP (uvicorn, starlette, FastAPI)", ("uvicorn", "starlette", "fastapi", "httptools")))


def role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return "?"
    if "multiprocessing" in cmd:  # a spawned child: what it is depends on who spawned it
        parent = role(ppid)
        return "PyTriton tensor store" if parent.startswith("embedded Triton") else f"child of {parent}"
    for needle, name in (("tritonserver", "tritonserver"), ("triton_python_backend_stub", "Triton python stub"),
                         ("serving.cli.main up", "serving up (supervisor)"),
                         (" worker", "worker (with --workers N: their parent)"),
                         (" triton", "embedded Triton (PyTriton, onnxruntime)"),
                         ("control-plane", "control plane"), ("statistics", "statistics service"),
                         ("wrk", "load client (wrk)"), ("benchmarks.loadgen", "load client (httpx)")):
        if needle in cmd:
            return name
    return cmd.split(" ")[0].rsplit("/", 1)[-1][:40]


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = int(fields[11]) + int(fields[12])  # utime + stime
    return out


def stage_shares(raw: Path) -> tuple[Counter, Counter, int]:
    """py-spy raw (collapsed) stacks -> samples by stage and by innermost frame."""
    stages, leaves, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if not f.startswith("process ")]  # py-spy's process labels
        if not frames:
            continue
        leaves[frames[-1][:110]] += n
        inner_first = list(reversed(frames))
        stage = next((name for name, needles in STAGES if any(any(x in f for x in needles) for f in inner_first)),
                     "other Python")
        stages[stage] += n
    return stages, leaves, total


def profile(target: Target, ctx: RunContext, seconds: float, out: Path) -> str:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    raw = out.with_suffix(".raw")
    spy_args = [pyspy, "record", "--pid", str(target.procs[0].pid), "--subprocesses", "--nonblocking",
                "--rate", "100", "--duration", str(int(seconds))]
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(level=load_level(target, ctx, ctx.mode.concurrency[0])))
    load.start()
    time.sleep(ctx.mode.warmup_s + 1)  # past the load's warm-up
    everything = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    before, t0 = cpu_ticks(everything), time.monotonic()
    subprocess.run([*spy_args, "--format", "raw", "--output", str(raw)], capture_output=True)
    wall = time.monotonic() - t0
    after = cpu_ticks(everything + [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()])
    load.join()
    by_role: Counter = Counter()
    for pid, ticks in after.items():
        used = (ticks - before.get(pid, 0)) / TICK  # a process that started meanwhile: all of it
        if used > 0:
            by_role[role(pid)] += used
    cores = os.cpu_count() or 1
    lines = [f"{target.system} on {ctx.workload.workload.name}: {result['level'].rps:.1f} req/s at "
             f"c={ctx.mode.concurrency[0]}; {wall:.1f} s sampled, {cores} cores = {cores * wall:.1f} CPU-s", "",
             "CPU by process (share of the whole machine):"]
    for name, used in by_role.most_common():
        lines.append(f"  {used / (cores * wall):6.1%}  {used:6.2f} CPU-s  {name}")
    lines.append(f"  {1 - sum(by_role.values()) / (cores * wall):6.1%}  idle")
    stages, leaves, total = stage_shares(raw)
    lines += ["", f"Python stacks of the server processes ({total} samples, py-spy):"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in stages.most_common()] if total else ["  (no samples)"]
    lines += ["", "Innermost frames:"] + [f"  {n / total:6.1%}  {name}" for name, n in leaves.most_common(15)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W2")
    p.add_argument("--system", default="platform-ort-1w", help="one variant id, as in --systems")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    console = Console()
    mode = resolve("quick", concurrency=(args.concurrency,))
    mode = dataclasses.replace(mode, duration_s=args.seconds + mode.warmup_s + 6)  # the load outlasts sampling
    workload = prepare(args.workload)
    log_dir = RESULTS_DIR / "logs" / "profile"
    corpus_path = log_dir / f"corpus-{args.workload}.json"
    corpus_mod.write_corpus(workload.tokenizer_dir, mode.corpus_size, corpus_path)
    ctx = RunContext(workload, corpus_path, mode, log_dir, select_variants(args.system))
    system = next(s for s in SYSTEMS if any(ctx.wants(v) for v in s.variants))
    gen = system.targets(ctx)
    try:
        target = next(t for t in gen if t.system == args.system)
        out = RESULTS_DIR / f"profile-{args.workload}-{args.system}"
        report = profile(target, ctx, args.seconds, out)
    finally:
        gen.close()
    out.with_suffix(".txt").write_text(report)
    console.print(report)
    console.print(f"wrote {out.with_suffix('.txt')} and {out.with_suffix('.raw')}")


if __name__ == "__main__":
    main()
