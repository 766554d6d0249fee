"""``python -m benchmarks.run [--quick|--full] [--workload W1,W2] [--systems ...] [--requests N]``.

Runs every system on the same corpus in one go: builds the workloads (offline),
writes the corpus, then for each system starts its processes, drives each
concurrency level with the closed-loop load generator in its own process, and
stops them before the next system starts, so no two systems share the cores.
Writes ``<mode>.json``, ``<mode>.md`` and ``<mode>.png`` under benchmarks/results/.
``--workload LLM`` runs the LLM streaming benchmark instead (``benchmarks.llm``: platform against
vLLM called directly; ``--concurrency`` gives its stream counts); ``--workload LLM-ROUTING`` the routing
policies side by side over two vLLM replicas (``benchmarks.llm_routing``); ``--workload LLM-RELAY`` the
worker's cost to an LLM endpoint measured with vLLM's own serving benchmark client (``benchmarks.llm_relay``);
``--workload LLM-RELAY-RATE`` tokens relayed from a replayed vLLM stream by the worker, a bare pass-through
and vllm-router (``benchmarks.llm_relay_rate``);
``--workload LLM-LORA`` a LoRA adapter's tokens/s against its base's on one engine (``benchmarks.llm_lora``);
``--workload EMB`` the embeddings one (``benchmarks.embeddings``: platform against Infinity,
sentence-transformers and the ceiling).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform as py_platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rich.console import Console

from benchmarks import corpus as corpus_mod
from benchmarks import wrk_load
from benchmarks.modes import MODES, Mode, resolve
from benchmarks.procs import REPO, child_env
from benchmarks.report import print_table, write_all
from benchmarks.results import LevelResult, RunResult, SystemResult, add_ratios, validity
from benchmarks.systems import ceiling, echo, fastapi_baseline, platform, triton_tokenizer
from benchmarks.systems.base import RunContext, System, Target, Unavailable
from benchmarks.workloads import WORKLOADS, prepare

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SYSTEMS: tuple[System, ...] = (ceiling.SYSTEM, fastapi_baseline.SYSTEM, triton_tokenizer.SYSTEM, platform.SYSTEM,
                                *echo.SYSTEMS)
console = Console(width=max(132, Console().width))


def select_variants(spec: str | None) -> frozenset[str]:
    """``--systems`` takes system names and/or variant ids; empty means everything."""
    if not spec:
        return frozenset()
    out: set[str] = set()
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        system = next((s for s in SYSTEMS if s.name == item), None)
        if system is not None:
            out.update(system.variants)
        elif any(item in s.variants for s in SYSTEMS):
            out.add(item)
        else:
            known = ", ".join(v for s in SYSTEMS for v in (s.name, *s.variants))
            raise SystemExit(f"unknown system {item!r}; known: {known}")
    return frozenset(out)


def load_level(target: Target, ctx: RunContext, concurrency: int) -> LevelResult:
    """One concurrency level: timed levels by wrk when installed (``benchmarks.wrk_load``), fixed
    request counts and machines without wrk by ``benchmarks.loadgen`` in its own process."""
    mode = ctx.mode
    if mode.requests is None and wrk_load.available():
        return LevelResult.from_dict(wrk_load.run_level(target.url, target.payload, ctx.corpus_path, concurrency,
                                                        mode.warmup_s, mode.duration_s, headers=target.headers))
    args = [sys.executable, "-m", "benchmarks.loadgen", "--url", target.url, "--payload", target.payload,
            "--corpus", str(ctx.corpus_path), "--concurrency", str(concurrency)]
    args += [a for name, value in target.headers.items() for a in ("--header", f"{name}: {value}")]
    if mode.requests is not None:
        args += ["--requests", str(mode.requests), "--warmup-requests", str(mode.warmup_requests)]
    else:
        args += ["--warmup-s", str(mode.warmup_s), "--duration-s", str(mode.duration_s)]
    expected = (mode.warmup_s + mode.duration_s) if mode.requests is None else 60
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=expected + 300)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    return LevelResult.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_http_system(system: System, ctx: RunContext) -> list[SystemResult]:
    results: list[SystemResult] = []
    gen = system.targets(ctx)
    try:
        for target in gen:
            result = SystemResult(ctx.workload.workload.name, target.system, target.label, details=target.details)
            try:
                for concurrency in ctx.mode.concurrency:
                    level = load_level(target, ctx, concurrency)
                    result.levels.append(level)
                    console.print(f"  {target.system} c={concurrency}: {level.rps:.1f} req/s, p99 {level.p99_ms:.1f} ms, "
                                  f"{level.errors + level.warmup_errors} errors")
            except Exception as exc:  # one failing level must not lose the others' numbers
                result.status, result.reason = "failed", str(exc)[:500]
                console.print(f"  [red]{target.system} failed[/red]: {exc}")
            results.append(result)
    except Unavailable as exc:
        results.append(SystemResult(ctx.workload.workload.name, system.name, system.description, "unavailable", str(exc)))
    except Exception as exc:
        console.print(f"  [red]{system.name} failed to start[/red]: {exc}")
        results.append(SystemResult(ctx.workload.workload.name, system.name, system.description, "failed",
                                    str(exc)[:500]))
    finally:
        gen.close()
    return results


def runs(system: System, ctx: RunContext) -> bool:
    return system.serves(ctx.workload.workload.name) and any(ctx.wants(v) for v in system.variants)


def run_workload(ctx: RunContext) -> list[SystemResult]:
    """Every wanted system on one workload. A bound (the ceiling) is measured ``ceiling_repeats``
    times, interleaved with the systems it bounds (first, then after each share of them), and
    kept as the best of its repeats (``ceiling.merge``): a bound measured once, before the
    others, says nothing of a machine that got faster meanwhile."""
    bounds = [s for s in SYSTEMS if s.measure is not None and runs(s, ctx)]
    others = [s for s in SYSTEMS if s.measure is None and runs(s, ctx)]
    if not bounds:
        return [r for s in others for r in run_system(s, ctx)]
    repeats = max(1, ctx.mode.ceiling_repeats)
    shares = [others[i * len(others) // (repeats - 1):(i + 1) * len(others) // (repeats - 1)]
              for i in range(repeats - 1)]
    measured: dict[str, list[SystemResult]] = {s.name: [] for s in bounds}
    results: list[SystemResult] = []
    for i in range(repeats):
        for bound in bounds:
            measured[bound.name].extend(run_system(bound, ctx, f" (repeat {i + 1}/{repeats})"))
        for system in shares[i] if i < len(shares) else []:
            results.extend(run_system(system, ctx))
    merged = [ceiling.merge(rs) for rs in measured.values()]
    for m in merged:
        if m.best_rps:
            console.print(f"  {m.system}: best of {repeats} repeats {m.best_rps:.1f} texts/s, repeats "
                          f"{m.details.get('repeats_rps')}, spread {m.details.get('spread_rps')}")
    return merged + results


def run_system(system: System, ctx: RunContext, note: str = "") -> list[SystemResult]:
    if not runs(system, ctx):
        return []
    console.print(f"[bold]{ctx.workload.workload.name} / {system.name}{note}[/bold]")
    t0 = time.monotonic()
    if system.measure is not None:
        try:
            results = [system.measure(ctx)]
            best = results[0].best
            console.print(f"  {system.name}: {best.rps:.1f} texts/s at {best.name}")
        except Exception as exc:
            console.print(f"  [red]{system.name} failed[/red]: {exc}")
            results = [SystemResult(ctx.workload.workload.name, system.name, system.description, "failed",
                                    str(exc)[:500])]
    else:
        results = run_http_system(system, ctx)
    console.print(f"  ({time.monotonic() - t0:.0f} s)")
    return results


def default_workloads(mode: Mode) -> list[str]:
    """The mode's workloads, plus the bert-base-sized W3 where onnxruntime has a GPU."""
    from benchmarks.systems.ort_session import providers

    gpu = "CUDAExecutionProvider" in providers()
    return [*mode.workloads, *(["W3"] if gpu and "W3" not in mode.workloads else [])]


def machine() -> dict:
    """What the numbers were measured on: they mean nothing without it."""
    import onnxruntime

    from benchmarks.systems.ort_session import providers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), py_platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": py_platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "providers": providers(), "commit": commit}
    info["summary"] = (f"{cpu}, {info['cores']} cores, onnxruntime {info['onnxruntime']} ({', '.join(info['providers'])}),"
                       f" commit {commit}")
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    group = p.add_mutually_exclusive_group()
    for name in MODES:
        group.add_argument(f"--{name}", dest="mode", action="store_const", const=name,
                           help=f"{name} mode" + (" (default)" if name == "quick" else ""))
    p.add_argument("--workload", default=None,
                   help=f"comma-separated, of {', '.join(WORKLOADS)}; or one of {', '.join(OWN_DRIVERS)}")
    p.add_argument("--systems", default=None, help="comma-separated system names or variant ids")
    p.add_argument("--requests", type=int, default=None, help="fixed requests per level instead of a duration")
    p.add_argument("--concurrency", default=None, help="comma-separated client counts, e.g. 1,8,32")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go")
    args = p.parse_args(argv)
    args.mode = args.mode or "quick"
    return args


# Workloads with a driver of their own (module in benchmarks/, and the runner's options as its arguments):
# LLM streams, TTFT and ITL (llm.py); the routing policies over two replicas (llm_routing.py); the relay's
# cost measured with vLLM's own client (llm_relay.py), and at a GPU's rate (llm_relay_rate.py); a LoRA adapter against its base (llm_lora.py); embeddings, sentences/s and tokens/s (embeddings.py).
OWN_DRIVERS: dict[str, tuple[str, Callable[[argparse.Namespace], list[str]]]] = {
    "LLM": ("llm", lambda a: ["--streams", a.concurrency] if a.concurrency else []),
    "LLM-ROUTING": ("llm_routing", lambda a: ["--quick"] if a.mode == "quick" and not a.concurrency else []),
    "LLM-RELAY": ("llm_relay", lambda a: ["--concurrency", a.concurrency] if a.concurrency else []),
    "LLM-RELAY-RATE": ("llm_relay_rate", lambda a: ["--streams", a.concurrency] if a.concurrency else []),
    "LLM-LORA": ("llm_lora", lambda a: [*(["--quick"] if a.mode == "quick" and not a.concurrency else []),
                                       *(["--streams", a.concurrency] if a.concurrency else [])]),
    "EMB": ("embeddings", lambda a: [*(["--quick"] if a.mode == "quick" else []),
                                     *(["--clients", a.concurrency] if a.concurrency else [])]),
}


def main(argv: list[str] | None = None) -> RunResult | None:
    args = parse_args(argv)
    own = OWN_DRIVERS.get(args.workload or "")
    if own is not None:  # a workload with its own driver, table and plot
        module, to_argv = own
        importlib.import_module(f"benchmarks.{module}").main(["--out", str(args.out), *to_argv(args)])
        return None
    concurrency = tuple(int(c) for c in args.concurrency.split(",")) if args.concurrency else None
    mode: Mode = resolve(args.mode, args.requests, concurrency)
    workloads = args.workload.split(",") if args.workload else default_workloads(mode)
    variants = select_variants(args.systems) or frozenset(
        v for s in SYSTEMS for v in s.variants if v not in mode.skip)
    log_dir = args.out / "logs" / args.mode
    command = "python -m benchmarks.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    run = RunResult(args.mode, datetime.now(timezone.utc).isoformat(timespec="seconds"), machine(), command,
                    {"size": mode.corpus_size, "words": f"{corpus_mod.MIN_WORDS}-{corpus_mod.MAX_WORDS}",
                     "seed": corpus_mod.SEED})
    t0 = time.monotonic()
    for name in workloads:
        with console.status(f"preparing {name} (first run: export to ONNX)"):
            workload = prepare(name)
        corpus_path = log_dir / f"corpus-{name}.json"
        corpus_mod.write_corpus(workload.tokenizer_dir, mode.corpus_size, corpus_path)
        ctx = RunContext(workload, corpus_path, mode, log_dir, variants)
        run.results.extend(run_workload(ctx))
    add_ratios(run.results)
    run.invalid = validity(run.results)
    run.machine["wall_s"] = round(time.monotonic() - t0, 1)
    print_table(run, console)
    paths = write_all(run, args.out)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())} in {run.machine['wall_s']:.0f} s")
    return run


if __name__ == "__main__":
    main()
