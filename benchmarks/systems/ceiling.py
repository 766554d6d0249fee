"""The ceiling: onnxruntime in one process, no HTTP, best batch size, same texts.

It is what the hardware gives for this model with tokenization included and
nothing else: any serving system's throughput over this is the share it keeps.
Each batch takes the next consecutive texts of the corpus and pads to its
longest (dynamic padding), as a server's batcher would. Two thread layouts are
tried for every batch size: one inference at a time using every core
(intra-op parallelism), and one inference per core side by side, one thread
each (what a server with concurrent requests can do); on this CPU the second is
the faster, so a ceiling without it would be one a server could beat. It runs
in a child process (``python -m benchmarks.systems.ceiling``) so its threads own the box.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.corpus import read_corpus
from benchmarks.procs import REPO, child_env, run_threads
from benchmarks.results import LevelResult, SystemResult
from benchmarks.systems.base import RunContext, System
from benchmarks.systems.ort_session import classify, providers, session, tokenizer

NAME = "ceiling"


def measure_batch_size(sess, tok, texts: list[str], batch: int, seconds: float, streams: int = 1,
                       infer=classify) -> dict:
    """``streams`` threads run batches of consecutive texts for ``seconds`` (at least 3 batches
    each): texts/s and batch latency. ``infer(sess, tok, texts)``: one batch's work (a classifier's
    by default; the embeddings benchmark pools instead: benchmarks/systems/embedding_ceiling.py)."""
    for start in range(0, 2 * batch, batch):  # warm-up: allocations for this shape range
        infer(sess, tok, _take(texts, start, batch))
    starts = itertools.count(0, batch)  # shared: the streams take the corpus in turn
    latencies: list[float] = []
    t_end = time.perf_counter() + seconds

    def stream() -> None:
        mine = 0
        while time.perf_counter() < t_end or mine < 3:
            t = time.perf_counter()
            infer(sess, tok, _take(texts, next(starts), batch))
            latencies.append(time.perf_counter() - t)
            mine += 1

    t0, cpu0 = time.perf_counter(), time.process_time()
    run_threads(stream, streams)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    done = len(latencies) * batch
    lat = np.asarray(latencies) * 1000.0
    return {"concurrency": streams, "batch_size": batch, "requests": done, "errors": 0, "duration_s": wall,
            "rps": done / wall, "cpu_ms_per_text": cpu * 1000.0 / done, "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)), "mean_ms": float(lat.mean())}


def layouts(cores: int) -> list[tuple[int, int]]:
    """(intra-op threads, streams): all cores on one inference, or one inference per core."""
    return sorted({(cores, 1), (1, cores)}, reverse=True)


def _take(texts: list[str], start: int, n: int) -> list[str]:
    return [texts[(start + i) % len(texts)] for i in range(n)]


def measure(ctx: RunContext) -> SystemResult:
    """Run the measurement in a child process and read its JSON."""
    wl = ctx.workload
    args = [sys.executable, "-m", "benchmarks.systems.ceiling", "--onnx", str(wl.onnx_path),
            "--tokenizer", str(wl.tokenizer_dir), "--corpus", str(ctx.corpus_path),
            "--batch-sizes", ",".join(map(str, ctx.mode.ceiling_batch_sizes)),
            "--seconds", str(ctx.mode.ceiling_seconds)]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"ceiling failed: {out.stderr[-2000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    levels = [LevelResult.from_dict(lv) for lv in data["levels"]]
    result = SystemResult(wl.workload.name, NAME, "ceiling: onnxruntime in-process, no HTTP", levels=levels,
                          details={"providers": data["providers"], "layouts": data["layouts"]})
    result.details["best_batch_size"] = result.best.batch_size if result.best else None
    return result


def merge(repeats: list[SystemResult]) -> SystemResult:
    """The ceiling over its repeats: each level's best, the repeats' best rates and their spread.

    A bound must not be lowered by one slow moment of a shared machine, so it is the best of its
    repeats; the spread (best minus worst repeat) is how far this machine moved during the run,
    the margin by which another system may appear to beat it before the run is called invalid."""
    ok = [r for r in repeats if r.best_rps]
    if not ok:
        return repeats[-1]
    best: dict[str, LevelResult] = {}
    for r in ok:
        for lv in r.levels:
            if lv.name not in best or lv.rps > best[lv.name].rps:
                best[lv.name] = lv
    rates = [r.best_rps for r in ok]
    merged = SystemResult(ok[0].workload, NAME, ok[0].label, levels=list(best.values()), details=dict(ok[0].details))
    merged.details.update(repeats_rps=[round(x, 1) for x in rates], spread_rps=round(max(rates) - min(rates), 1),
                          failed_repeats=len(repeats) - len(ok))
    merged.details["best_batch_size"] = merged.best.batch_size if merged.best else None
    return merged


def run_levels(argv: list[str] | None, description: str, batch_sizes: str, seconds: float,
               infer=None) -> dict:
    """The child process's command line and loop, shared by the classifier and the embeddings ceilings:
    every thread layout, every batch size; ``infer`` is the batch work (the classifier's by default)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--onnx", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--batch-sizes", default=batch_sizes)
    p.add_argument("--seconds", type=float, default=seconds)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--layout", default=None, help="THREADSxSTREAMS: that layout only (one already found best)")
    args = p.parse_args(argv)
    tok, texts = tokenizer(args.tokenizer), read_corpus(args.corpus)
    infer = infer or classify
    levels = []
    chosen = [tuple(map(int, args.layout.split("x")))] if args.layout else layouts(args.cores)
    for threads, streams in chosen:
        sess = session(args.onnx, threads)
        for b in args.batch_sizes.split(","):
            levels.append({**measure_batch_size(sess, tok, texts, int(b), args.seconds, streams, infer),
                           "intra_op_threads": threads})
    return {"levels": levels, "layouts": chosen}


def main(argv: list[str] | None = None) -> None:
    out = run_levels(argv, "in-process onnxruntime ceiling", "1,8,32", 2.0)
    print(json.dumps({"levels": out["levels"], "providers": providers(), "layouts": out["layouts"]}))

SYSTEM = System(NAME, "onnxruntime in one process, no HTTP, best batch size with dynamic padding",
                variants=(NAME,), measure=measure)

if __name__ == "__main__":
    main()
