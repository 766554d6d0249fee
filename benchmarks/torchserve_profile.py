"""``python -m benchmarks.torchserve_profile --workload mnist --system platform --variant p1-h1-b8 [--clients 32]``.

Where one configuration of the TorchServe benchmark spends its CPU at full load: the system is started
as benchmarks/torchserve.py starts it (that configuration only), driven by the same wrk client for
``--seconds``, and meanwhile (1) each of its processes' CPU time is read, by part (frontend, backend
workers, worker processes, handler processes, ...), and (2) every Python process of it is sampled by
py-spy (``--nonblocking``: the processes are not paused, so the rate holds). Each Python process's
samples are put in the stage of their innermost known frame (HTTP, routing, statistics, the pipe to
the handler, TorchServe's context, preprocessing, the model, the answer's JSON, ...). Prints the
summary and writes it to ``results/profile-torchserve-<workload>-<system>-<variant>.txt``, with
py-spy's collapsed stacks beside it (``.raw``, for speedscope.app or flamegraph.pl).
"""
from __future__ import annotations

import argparse
import subprocess
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from benchmarks import wrk_load
from benchmarks.torchserve import RESULTS_DIR, console, start_systems
from benchmarks.torchserve_cpu import cpu_between, snapshot
from benchmarks.torchserve_archives import workload
from benchmarks.torchserve_systems import role

# innermost frame first wins: (stage, needles in a frame's text)
STAGES = (
    ("model: onnxruntime", ("InferenceSession.run", "onnx_swap.py", "OnnxRunner")),
    ("model: torch forward", ("forward (", "Module._call_impl", "BaseHandler.inference", "libtorch_cpu", "libgomp")),
    ("preprocess: decode + transforms", ("PIL", "torchvision", "VisionHandler.preprocess", "preprocess (")),
    ("postprocess", ("postprocess",)),
    ("answer JSON (encode_answer)", ("encode_answer", "json/encoder")),
    ("TorchServe context and metrics", ("ts/context", "ts/metrics", "RequestProcessor", "timer.py", "logging/")),
    ("pipe to the handler (pickle, socket)", ("handler_process.py:4", "handler_process.py:5", "_exactly", "pickle",
                                              "handler_pool.py", "receive (", "send (")),
    ("statistics", ("serving/statistics/", "stats_exchange", "version_stats", "recorder")),
    ("data plane (routing, keys, versions)", ("serving/worker/dataplane", "serving/worker/routing",
                                              "client_keys", "preprocess/handler")),
    ("TorchServe front end (/predictions)", ("frontends/torchserve", "frontends/body")),
    ("HTTP (uvicorn, starlette, FastAPI)", ("uvicorn", "starlette", "fastapi", "httptools", "h11")),
    ("event loop and threads", ("asyncio", "uvloop", "threading.py", "queue.py", "selectors")),
)


def stage_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for stage, needles in STAGES:
            if any(n in frame for n in needles):
                return stage
    return "other"


def summarize_raw(raw: Path) -> tuple[Counter, Counter, int]:
    """(samples by stage, samples by innermost frame, all samples) of one py-spy raw file."""
    stages, frames, total = Counter(), Counter(), 0
    for line in raw.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        stack_text, _, count = line.rpartition(" ")
        stack = stack_text.split(";")
        n = int(count)
        total += n
        stages[stage_of(stack)] += n
        frames[stack[-1][:140]] += n
    return stages, frames, total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.torchserve_profile", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mnist")
    p.add_argument("--system", default="platform")
    p.add_argument("--variant", default="p1-h1-b8")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    args = p.parse_args(argv)
    work = workload(args.workload)
    log_dir = RESULTS_DIR / "logs" / "torchserve-profile"
    files = work.write_inputs(log_dir / "inputs" / work.name)
    stem = RESULTS_DIR / f"profile-torchserve-{args.workload}-{args.system}-{args.variant}"
    with ExitStack() as stack:
        (variant,) = start_systems(stack, work, {args.system}, {args.variant}, log_dir, {"failed": {}})
        wrk_load.run_files(variant.url, files, args.clients, 5, timeout_s=300)  # warm (JIT, first batches)
        procs = variant.processes()
        measured: dict = {}
        load = threading.Thread(target=lambda: measured.update(
            wrk_load.run_files(variant.url, files, args.clients, args.seconds + 2, timeout_s=300)))
        load.start()
        time.sleep(1)
        before = snapshot(procs)
        spies = {}
        for proc in procs:
            part = role(proc)
            if part in ("frontend (Java)", "torchserve CLI", "supervisor", "gone"):
                continue
            raw = stem.parent / f"{stem.name}-{part.replace(' ', '_')}-{proc.pid}.raw"
            spies[proc.pid] = (part, raw, subprocess.Popen(
                ["py-spy", "record", "--nonblocking", "-r", str(args.rate), "-d", str(int(args.seconds)), "-f", "raw",
                 "-o", str(raw), "--pid", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(args.seconds)
        cpu = cpu_between(before, snapshot(procs))
        for _, _, spy in spies.values():
            spy.wait(60)
        load.join()
    lines = [f"{args.system} {variant.label} ({args.variant}), {args.workload}, {args.clients} clients, "
             f"{measured.get('rps', 0):.1f} req/s, p99 {measured.get('p99_ms', 0):.1f} ms while profiled", "",
             f"CPU over {args.seconds:.0f} s, share of the machine ({cpu['cpu_s'] / args.seconds / _cores():.0%} "
             f"this system, {cpu['foreign_cpu_share']:.0%} the rest):"]
    lines += [f"  {part:28s} {seconds / args.seconds / _cores():6.1%}" for part, seconds in
              sorted(cpu["cpu_s_by_part"].items(), key=lambda kv: -kv[1])]
    for pid, (part, raw, _) in spies.items():
        if not raw.exists():
            lines += ["", f"{part} (pid {pid}): no samples (py-spy could not attach)"]
            continue
        stages, frames, total = summarize_raw(raw)
        lines += ["", f"{part} (pid {pid}), {total} samples, by stage:"]
        lines += [f"  {stage:40s} {n / total:6.1%}" for stage, n in stages.most_common()]
        lines += ["  innermost frames:"] + [f"    {n / total:6.1%} {frame}" for frame, n in frames.most_common(12)]
    text = "\n".join(lines) + "\n"
    stem.with_suffix(".txt").write_text(text)
    console.print(text)
    console.print(f"wrote {stem}.txt and the .raw stacks beside it")


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    main()
