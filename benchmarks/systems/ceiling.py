"""The ceiling: onnxruntime in one process, no HTTP, best batch size, same texts.

It is what the hardware gives for this model with tokenization included and
nothing else: any serving system's throughput over this is the share it keeps.
Each batch takes the next consecutive texts of the corpus and pads to its
longest (dynamic padding), as a server's batcher would. It runs in a child
process (``python -m benchmarks.systems.ceiling``) so its threads own the box.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.corpus import read_corpus
from benchmarks.procs import REPO, child_env
from benchmarks.results import LevelResult, SystemResult
from benchmarks.systems.base import RunContext, System
from benchmarks.systems.ort_session import classify, providers, session, tokenizer

NAME = "ceiling"


def measure_batch_size(sess, tok, texts: list[str], batch: int, seconds: float) -> dict:
    """Batches of consecutive texts for ``seconds`` (at least 3): texts/s and batch latency."""
    for start in range(0, 2 * batch, batch):  # warm-up: allocations for this shape range
        classify(sess, tok, _take(texts, start, batch))
    latencies, done, start = [], 0, 0
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < t_end or len(latencies) < 3:
        t = time.perf_counter()
        classify(sess, tok, _take(texts, start, batch))
        latencies.append(time.perf_counter() - t)
        done += batch
        start += batch
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000.0
    return {"concurrency": 1, "batch_size": batch, "requests": done, "errors": 0, "duration_s": wall,
            "rps": done / wall, "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)), "mean_ms": float(lat.mean())}


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
                          details={"providers": data["providers"], "threads": data["threads"]})
    result.details["best_batch_size"] = result.best.batch_size if result.best else None
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="in-process onnxruntime ceiling")
    p.add_argument("--onnx", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    sess, tok = session(args.onnx, args.threads), tokenizer(args.tokenizer)
    texts = read_corpus(args.corpus)
    levels = [measure_batch_size(sess, tok, texts, int(b), args.seconds) for b in args.batch_sizes.split(",")]
    threads = sess.get_session_options().intra_op_num_threads
    print(json.dumps({"levels": levels, "providers": providers(), "threads": threads}))


SYSTEM = System(NAME, "onnxruntime in one process, no HTTP, best batch size with dynamic padding",
                variants=(NAME,), measure=measure)

if __name__ == "__main__":
    main()
