"""``python -m benchmarks.torchserve [--quick] [--repeats N] [--workloads resnet18,mnist] [--systems ...]``.

Real TorchServe against this platform on the same archives on the same machine
(benchmarks/torchserve_systems.py says how each is started, benchmarks/torchserve_archives.py what
the archives are). Per workload, in one run:

1. **the ceiling** (benchmarks/systems/torchserve_ceiling.py): the archive's handler in one process,
   no HTTP, torch and onnxruntime, every batch size and thread layout; before and after the rest;
2. **answers**: every input PUT to every configuration of every system, and each answer compared
   with TorchServe's own (1 worker, batch 1): JSON equal, numbers within 1e-5; the largest
   difference is recorded, and a configuration that answers otherwise is left out of the timing;
3. **the sweep**: every configuration (TorchServe: 1 or 2 workers, batch 1 or 8 with a 5 ms delay;
   the platform: 1 or 2 worker processes, 1 or 2 handler processes, the same batches) measured once
   at every client count, to find each system's best configuration per level;
4. **the record**: at each client count, the best configuration of each system measured
   ``--repeats`` times in ABBA order (A B C, C B A, ...), so the shared machine's drift weighs on
   all alike; a system's figure pools its passes.

Load: closed loop, ``clients`` connections each sending the next request when its answer arrives,
every body a whole file sent raw as ``curl -T`` sends it (PUT, no content type) to
``/predictions/{name}``, by wrk (benchmarks/wrk/closed_loop.lua, its WRK_FILES mode); ``--requests N`` instead sends N
requests a level from Python threads (the smoke test). Per level: requests/s, p50/p99, and the CPU
time of each system's processes per request, by part (frontend, backend workers, handler
processes, ...), and the CPU the rest of the machine used meanwhile (``foreign``: other engineers'
jobs on a shared box; a level during which they took more than 15% of the machine is measured again,
at most twice, for every system alike, and the figure is kept either way). Writes
``results/torchserve.json``, ``.md`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np
import psutil

from benchmarks import wrk_load
from benchmarks.report import write_outputs
from benchmarks.procs import REPO, child_env, run_threads
from benchmarks.torchserve_answers import TOLERANCE, answers, check_answers
from benchmarks.torchserve_archives import Workload, workload
from benchmarks.torchserve_cpu import cpu_between, settle, snapshot
from benchmarks.torchserve_report import console, markdown, plot, print_tables, summarize
from benchmarks.torchserve_systems import (
    PLATFORM_GRID, TORCHSERVE_1THREAD_GRID, TORCHSERVE_GRID, Variant, grid_id, java_and_cli, onnx_option, platform,
    torchserve,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SYSTEMS = ("torchserve", "torchserve-1thread", "platform", "platform-onnx", "ceiling")
REFERENCE = ("torchserve", "w1-b1")  # whose answers the others must give
FOREIGN_LIMIT = 0.15  # share of the machine others may use during a level before it is measured again
RETRIES = 2
RETRY_PAUSE_S = 10.0


# --- load ---------------------------------------------------------------------------------------------

def fixed_count(url: str, bodies: list[bytes], clients: int, requests: int, timeout_s: float = 300) -> dict:
    """``requests`` PUTs from ``clients`` threads in a closed loop (the smoke test's few requests: wrk
    only runs for a duration). A LevelResult as a dict."""
    lock = threading.Lock()
    latencies: list[float] = []
    state = {"issued": 0, "errors": 0, "first_error": None}

    def client() -> None:
        with httpx.Client(timeout=timeout_s) as http:
            while True:
                with lock:
                    if state["issued"] >= requests:
                        return
                    i = state["issued"]
                    state["issued"] += 1
                started = time.perf_counter()
                try:
                    answer = http.put(url, content=bodies[i % len(bodies)])
                    failed = None if answer.status_code == 200 else f"{answer.status_code} {answer.text[:200]}"
                except httpx.HTTPError as exc:
                    failed = repr(exc)
                with lock:
                    if failed:
                        state["errors"] += 1
                        state["first_error"] = state["first_error"] or failed
                    else:
                        latencies.append(time.perf_counter() - started)

    t0 = time.perf_counter()
    run_threads(client, clients)
    wall = time.perf_counter() - t0
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([np.nan])
    return {"concurrency": clients, "requests": len(latencies), "errors": state["errors"], "warmup_errors": 0,
            "first_error": state["first_error"], "duration_s": wall, "rps": len(latencies) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "client": "httpx"}


@dataclass(frozen=True)
class Load:
    """How each level is driven: durations for wrk, or a fixed request count."""

    warmup_s: float
    seconds: float
    requests: int | None = None


def measure(variant: Variant, files: list[Path], clients: int, load: Load) -> dict:
    """One level on one configuration, taken again (up to :data:`RETRIES` times, after a pause) while the
    rest of the machine used more than :data:`FOREIGN_LIMIT` of it meanwhile: other engineers' jobs on this
    shared box took a configuration's rate to a fifth of itself in a sweep, which then picked another
    configuration as the system's best. Every system gets the same rule; the taken runs' foreign shares
    are kept (``foreign_retries``)."""
    level = _measure_once(variant, files, clients, load)
    shares = [level["foreign_cpu_share"]]
    for _ in range(RETRIES):
        if level["foreign_cpu_share"] <= FOREIGN_LIMIT or load.requests:
            break
        console.print(f"  [yellow]{line(level)}: the rest of the machine was busy, measured again[/yellow]")
        time.sleep(RETRY_PAUSE_S)
        level = _measure_once(variant, files, clients, load)
        shares.append(level["foreign_cpu_share"])
    level["foreign_retries"] = [round(x, 3) for x in shares[:-1]]
    return level


def _measure_once(variant: Variant, files: list[Path], clients: int, load: Load) -> dict:
    """A warm-up (discarded), then the measured run with the CPU of the system's processes taken around it."""
    if load.requests:
        bodies = [f.read_bytes() for f in files]
        before = snapshot(variant.processes())
        level = fixed_count(variant.url, bodies, clients, load.requests)
    else:
        if load.warmup_s > 0:
            wrk_load.run_files(variant.url, files, clients, load.warmup_s, timeout_s=300)
        before = snapshot(variant.processes())
        level = wrk_load.run_files(variant.url, files, clients, load.seconds, timeout_s=300)
    cpu = cpu_between(before, snapshot(variant.processes()))
    level.update(cpu, system=variant.system, variant=variant.id,
                 cpu_ms_per_request=cpu["cpu_s"] * 1000 / max(1, level["requests"]),
                 settle_s=settle(variant.processes()))
    return level


def line(level: dict) -> str:
    return (f"{level['system']} {level['variant']} at {level['concurrency']} clients: {level['rps']:.1f} req/s, "
            f"p50 {level['p50_ms']:.1f} ms, p99 {level['p99_ms']:.1f} ms, {level['cpu_ms_per_request']:.1f} CPU "
            f"ms/req, foreign {level['foreign_cpu_share']:.0%}, errors {level['errors']}")


def warm_up(variants: list[Variant], files: list[Path], clients: int, load: Load) -> None:
    """Every configuration under load for a while before anything is measured: TorchServe's JVM compiles
    its hot paths (C2) over its first thousands of requests (a first sweep of mnist measured its 1-client
    level at half the rate of the same level minutes later), and each handler process meets its first
    batch sizes (the ONNX swap exports on its first batch)."""
    for variant in variants:
        if load.requests:
            fixed_count(variant.url, [f.read_bytes() for f in files], clients, load.requests)
        else:
            wrk_load.run_files(variant.url, files, clients, max(1.0, 3 * load.warmup_s), timeout_s=300)
        settle(variant.processes())


def sweep(variants: list[Variant], files: list[Path], clients: list[int], load: Load) -> list[dict]:
    """Every configuration once per level, where a system has more than one (its best is then known)."""
    counts = {v.system: sum(1 for w in variants if w.system == v.system) for v in variants}
    rows = []
    for n in clients:
        for variant in variants:
            if counts[variant.system] > 1:
                rows.append(measure(variant, files, n, load))
                console.print("  sweep: " + line(rows[-1]))
    return rows


def best_variants(variants: list[Variant], swept: list[dict], clients: int) -> list[Variant]:
    """Each system's configuration of highest requests/s at this level (its only one when not swept)."""
    chosen = []
    for system in dict.fromkeys(v.system for v in variants):
        own = [v for v in variants if v.system == system]
        rows = [r for r in swept if r["system"] == system and r["concurrency"] == clients and r["requests"]]
        if len(own) > 1 and rows:
            top = max(rows, key=lambda r: (r["rps"], -r["p99_ms"]))
            own = [v for v in own if v.id == top["variant"]]
        chosen.append(own[0])
    return chosen


def record(variants: list[Variant], files: list[Path], clients: int, load: Load, repeats: int) -> list[dict]:
    """``repeats`` ABBA passes over the systems' chosen configurations at one level, pooled per system:
    requests/s the mean of the passes, p50/p99 the mean of theirs, CPU per request over all of them."""
    passes: dict[str, list[dict]] = {v.system: [] for v in variants}
    for i in range(repeats):
        for variant in variants if i % 2 == 0 else variants[::-1]:
            passes[variant.system].append(measure(variant, files, clients, load))
            console.print("  record: " + line(passes[variant.system][-1]))
    pooled = []
    for variant in variants:
        runs = passes[variant.system]
        answered = sum(r["requests"] for r in runs)
        parts: dict[str, float] = {}
        for r in runs:
            for name, cpu in r["cpu_s_by_part"].items():
                parts[name] = parts.get(name, 0.0) + cpu
        pooled.append({
            "system": variant.system, "variant": variant.id, "label": variant.label, "concurrency": clients,
            "rps": float(np.mean([r["rps"] for r in runs])), "passes_rps": [round(r["rps"], 2) for r in runs],
            "p50_ms": float(np.mean([r["p50_ms"] for r in runs])), "p99_ms": float(np.mean([r["p99_ms"] for r in runs])),
            "passes_p99_ms": [round(r["p99_ms"], 1) for r in runs],
            "cpu_ms_per_request": sum(r["cpu_s"] for r in runs) * 1000 / max(1, answered),
            "cpu_ms_per_request_by_part": {k: round(v * 1000 / max(1, answered), 3) for k, v in parts.items()},
            "requests": answered, "errors": sum(r["errors"] for r in runs),
            "foreign_cpu_share": float(np.mean([r["foreign_cpu_share"] for r in runs])),
            "steal_share": float(np.mean([r["steal_share"] for r in runs])), "client": runs[0]["client"],
            "remeasured": sum(len(r.get("foreign_retries", ())) for r in runs)})
    return pooled


# --- the ceiling --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CeilingPlan:
    """What the ceiling sweeps (benchmarks/systems/torchserve_ceiling.py) and how often it runs: before
    the HTTP systems and, with ``repeats`` 2, after them too (the best of both is kept)."""

    seconds: float
    layouts: str = "1x2,2x1"
    batch_sizes: str = "1,8"
    repeats: int = 2


def ceiling(work: Workload, files: list[Path], plan: CeilingPlan, runtimes: list[str], log: Path) -> dict:
    """The ceiling child's sweep, with each input's answers."""
    args = [sys.executable, "-m", "benchmarks.systems.torchserve_ceiling", "--mar", str(work.mar), "--inputs",
            ",".join(map(str, files)), "--runtimes", ",".join(runtimes), "--seconds", str(plan.seconds),
            "--layouts", plan.layouts, "--batch-sizes", plan.batch_sizes, "--answers"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        out = subprocess.run(args, stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=child_env(), timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"the ceiling failed ({out.returncode}); see {log}")
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def merge_ceilings(runs: list[dict]) -> dict:
    """Per runtime, the best configuration over the runs (before and after the HTTP systems)."""
    merged: dict[str, Any] = {"runs": [{k: v for k, v in run.items() if k != "answers"} for run in runs]}
    for key in {k for run in runs for k in run if k.startswith("best_")}:
        best = max((run[key] for run in runs if key in run), key=lambda lv: lv["rps"])
        merged[key.removeprefix("best_")] = {**best, "repeats_rps": [round(run[key]["rps"], 1) for run in runs
                                                                     if key in run]}
    return merged


# --- one workload -------------------------------------------------------------------------------------

def start_systems(stack: ExitStack, work: Workload, wanted: set[str], variants: set[str] | None, log_dir: Path,
                  result: dict) -> list[Variant]:
    """Every wanted system started side by side (in threads: their starts take a while; idle, they cost
    next to nothing); one that cannot start is recorded as such, the others go on."""
    starters: dict[str, Callable[[], Any]] = {}
    for system, grid in (("torchserve", TORCHSERVE_GRID), ("torchserve-1thread", TORCHSERVE_1THREAD_GRID)):
        if system in wanted and _any_wanted(system, grid, variants):
            starters[system] = lambda s=system: torchserve(work, log_dir / f"{s}-home", s, variants)
    for processes in (1, 2):
        grid = [values for values in PLATFORM_GRID if values[0] == processes]
        systems = {s for s in wanted & {"platform", "platform-onnx"} if _any_wanted(s, grid, variants)}
        if systems:
            starters[f"platform-{processes}p"] = lambda p=processes, s=systems: platform(
                work, log_dir / f"platform-{p}p-home", log_dir / f"platform-{p}p.log", p, s, variants)

    def enter(name: str) -> tuple[str, Any, list[Variant] | Exception, float]:
        t0 = time.monotonic()
        manager = starters[name]()
        try:
            return name, manager, manager.__enter__(), time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others' figures
            return name, None, exc, time.monotonic() - t0

    found: list[Variant] = []
    # TorchServe with OMP_NUM_THREADS=1 changes this process's environment while it starts: alone, first
    alone = [enter(name) for name in starters if name == "torchserve-1thread"]
    with ThreadPoolExecutor(max_workers=len(starters) or 1) as pool:
        together = pool.map(enter, [name for name in starters if name != "torchserve-1thread"])
        for name, manager, got, took in [*alone, *together]:
            if manager is not None:
                stack.push(manager.__exit__)
            if isinstance(got, Exception):
                console.print(f"  [red]{name} failed to start[/red]: {str(got)[:2000]}")
                result["failed"][name] = str(got)[:3000]
                continue
            console.print(f"  {name} up in {took:.0f} s: {', '.join(v.id for v in got) or 'no configuration'}")
            found += got
    order = {s: i for i, s in enumerate(SYSTEMS)}
    return sorted(found, key=lambda v: (order[v.system], v.id))


def _any_wanted(system: str, grid: Any, variants: set[str] | None) -> bool:
    return not variants or any(grid_id(system, values) in variants for values in grid)


def check_all(variants: list[Variant], work: Workload, ceiling_answers: dict[str, dict[str, str]],
              result: dict) -> list[Variant]:
    """The answer check; returns the configurations whose answers are the reference's."""
    reference_variant = next((v for v in variants if (v.system, v.id) == REFERENCE), None)
    if reference_variant is None:
        result["answers"] = {"reference": None, "checks": []}
        console.print("  [yellow]no TorchServe w1-b1 to check answers against[/yellow]")
        return variants
    reference = answers(reference_variant.url, work.inputs)
    checks, kept = [], []
    for variant in variants:
        check = {"system": variant.system, "variant": variant.id, **check_answers(reference, answers(variant.url, work.inputs))}
        checks.append(check)
        if check["equal"]:
            kept.append(variant)
        else:
            console.print(f"  [red]{variant.system} {variant.id} answers otherwise[/red]: {check['problem']}")
    for runtime, got in ceiling_answers.items():
        checks.append({"system": "ceiling", "variant": runtime, **check_answers(reference, got)})
    result["answers"] = {"reference": "torchserve w1-b1", "tolerance": TOLERANCE, "checks": checks,
                         "sample": next(iter(reference.values()))[:400]}
    worst = max((c["max_abs_diff"] or 0.0 for c in checks if c["equal"]), default=0.0)
    console.print(f"  answers: {sum(c['equal'] for c in checks)} of {len(checks)} configurations answer as "
                  f"TorchServe does (largest difference {worst:.2g})")
    return kept


def run_workload(name: str, wanted: set[str], variants: set[str] | None, clients: list[int], sweep_load: Load,
                 record_load: Load, repeats: int, plan: CeilingPlan, log_dir: Path) -> dict:
    work = workload(name)
    files = work.write_inputs(log_dir / "inputs" / name)
    result: dict[str, Any] = {"notes": work.notes, "inputs": work.details.get("input_bytes"), "failed": {},
                              "variants": {}, "sweep": [], "levels": []}
    runtimes = ["torch"] + (["onnx"] if "platform-onnx" in wanted or "ceiling" in wanted else [])
    runs = []
    if "ceiling" in wanted:
        runs.append(ceiling(work, files, plan, runtimes, log_dir / f"ceiling-{name}.log"))
        console.print("  ceiling: " + ", ".join(f"{r} {runs[-1]['best_' + r]['rps']:.1f} req/s" for r in runtimes))
    with ExitStack() as stack:
        found = start_systems(stack, work, wanted, variants, log_dir / name, result)
        result["variants"] = {f"{v.system} {v.id}": {"label": v.label, **v.settings} for v in found}
        found = check_all(found, work, runs[0]["answers"] if runs else {}, result)
        warm_up(found, files, max(clients), sweep_load)
        result["sweep"] = sweep(found, files, clients, sweep_load)
        for n in clients:
            result["levels"] += record(best_variants(found, result["sweep"], n), files, n, record_load, repeats)
    if "ceiling" in wanted:
        if plan.repeats > 1:
            runs.append(ceiling(work, files, plan, runtimes, log_dir / f"ceiling-{name}.log"))
        result["ceiling"] = merge_ceilings(runs)
    return result


# --- the command --------------------------------------------------------------------------------------

def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "cpu")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=REPO).stdout.strip())
    import onnxruntime
    import torch

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    from importlib.metadata import version

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "commit": commit + ("+changes" if dirty else ""), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "torchserve": version("torchserve"),
            "java": java[0] if java else None}


def unavailable(wanted: set[str]) -> dict[str, str]:
    """Systems that cannot run here, and why (reported, not fatal)."""
    out = {}
    why = java_and_cli()
    if why:
        out.update({s: why for s in wanted if s.startswith("torchserve")})
    if "platform-onnx" in wanted and onnx_option():
        out["platform-onnx"] = onnx_option()
    if not wrk_load.available():
        out["wrk"] = "wrk is not installed: timed levels need it (apt-get install wrk), --requests does not"
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.torchserve", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 8 clients, short levels, one pass")
    p.add_argument("--repeats", type=int, default=None, help="ABBA passes of the record (default 2; quick 1)")
    p.add_argument("--workloads", default="resnet18,mnist")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--variants", default="", help="only these configurations, e.g. w1-b1,p1-h1-b1")
    p.add_argument("--clients", default=None, help="client counts (default 1,8,32; quick 1,8)")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds a recorded level (default 8)")
    p.add_argument("--sweep-seconds", type=float, default=None, help="measured seconds a swept level (default 3)")
    p.add_argument("--warmup-s", type=float, default=None, help="discarded seconds before each level (default 2)")
    p.add_argument("--ceiling-seconds", type=float, default=None, help="per ceiling configuration (default 4)")
    p.add_argument("--ceiling-layouts", default="1x2,2x1", help="ceiling STREAMSxTHREADS layouts")
    p.add_argument("--ceiling-batch-sizes", default="1,8")
    p.add_argument("--ceiling-repeats", type=int, default=2, help="1: before the HTTP systems only")
    p.add_argument("--requests", type=int, default=None, help="a fixed request count a level instead of durations")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    defaults = ({"repeats": 1, "clients": "1,8", "seconds": 3.0, "sweep_seconds": 2.0, "warmup_s": 1.0,
                 "ceiling_seconds": 2.0} if args.quick else
                {"repeats": 2, "clients": "1,8,32", "seconds": 8.0, "sweep_seconds": 3.0, "warmup_s": 2.0,
                 "ceiling_seconds": 4.0})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = wanted - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    missing = unavailable(wanted)
    if "wrk" in missing and not args.requests:
        raise SystemExit(missing["wrk"])
    for system, why in missing.items():
        console.print(f"[yellow]{system} left out[/yellow]: {why}")
    wanted -= set(missing)
    variants = {v.strip() for v in args.variants.split(",") if v.strip()} or None
    clients = [int(c) for c in args.clients.split(",")]
    t0 = time.monotonic()
    load_before = [round(x, 2) for x in psutil.getloadavg()]
    result: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.torchserve " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(), "unavailable": missing, "workloads": {},
        "settings": {"clients": clients, "seconds": args.seconds, "sweep_seconds": args.sweep_seconds,
                     "warmup_s": args.warmup_s, "repeats": args.repeats, "requests": args.requests,
                     "ceiling_seconds": args.ceiling_seconds, "tolerance": TOLERANCE}}
    sweep_load = Load(args.warmup_s, args.sweep_seconds, args.requests)
    record_load = Load(args.warmup_s, args.seconds, args.requests)
    log_dir = args.out / "logs" / "torchserve"
    for name in (w.strip() for w in args.workloads.split(",") if w.strip()):
        console.print(f"[bold]{name}[/bold]")
        plan = CeilingPlan(args.ceiling_seconds, args.ceiling_layouts, args.ceiling_batch_sizes, args.ceiling_repeats)
        result["workloads"][name] = run_workload(name, wanted, variants, clients, sweep_load, record_load,
                                                 args.repeats, plan, log_dir)
    result.update(wall_s=round(time.monotonic() - t0, 1),
                  load_average={"before": load_before, "after": [round(x, 2) for x in psutil.getloadavg()]})
    result["summary"] = summarize(result)
    print_tables(result)
    write_outputs(args.out, "torchserve", result, markdown, plot, console)
    return result


if __name__ == "__main__":
    main()
