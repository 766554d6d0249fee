"""``python -m benchmarks.llm_lora [--streams 1,8] [--requests 16] [--max-tokens 64] [--quick]``.

A LoRA adapter's tokens/s against its base's (issue 36), on the same engine: the platform as `serving up`
runs it (control plane, the LLM launcher, one worker), one random-weight Llama (``--hidden``, 4 layers,
float32) uploaded as ``bench-llm:1`` and a rank-8 PEFT adapter of it (``q_proj``, ``v_proj``) uploaded
with ``--base bench-llm:1``. Endpoint ``base`` serves the model, endpoint ``bot`` the adapter; both run in
the one engine the launcher starts with LoRA on, so the only difference between them is the adapter's
computation. At each number of streams, each stream sends ``--requests`` streamed chat requests one after
another (greedy, ``ignore_eos``, ``--max-tokens`` out), in passes base, adapter, adapter, base, so that a
drift of the machine over the run weighs on both alike. Figures: output tokens/s and TTFT p50/p90 per
system, and the adapter's tokens/s as a share of the base's. Writes ``results/llm_lora.json`` and
``results/llm_lora.png``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.llm_routing import Run, turn
from benchmarks.llm_stack import LLMStack, corpus_words, save

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ENDPOINTS = {"base": "base", "adapter": "bot"}
ORDER = ("base", "adapter", "adapter", "base")
LAYERS = 4
console = Console(width=132)


async def one_pass(url: str, endpoint: str, streams: int, requests: int, max_tokens: int, words: list[str],
                   seed: int) -> Run:
    run, rng = Run(endpoint), random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async def client(i: int) -> None:
            for r in range(requests):
                prompt = " ".join(rng.choice(words) for _ in range(48))
                await turn(session, url, endpoint, f"{seed}-{i}-{r}", [{"role": "user", "content": prompt}],
                           max_tokens, run)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(streams)))
        run.wall_s = time.perf_counter() - t0
    return run


def merged(system: str, streams: int, runs: list[Run]) -> dict:
    ttft = np.array([t for r in runs for t in r.ttft_s]) * 1000
    tokens, wall = sum(r.output_tokens for r in runs), sum(r.wall_s for r in runs)
    return {"system": system, "streams": streams, "requests": sum(r.requests for r in runs),
            "errors": sum(r.errors for r in runs), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 1) if wall else 0.0,
            "passes_tokens_per_s": [round(r.output_tokens / r.wall_s, 1) for r in runs if r.wall_s],
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1) if len(ttft) else None,
            "ttft_p90_ms": round(float(np.percentile(ttft, 90)), 1) if len(ttft) else None}


def run(levels: list[int], requests: int, max_tokens: int, hidden: int, rank: int, root: Path) -> dict:
    from serving.llm.naming import engine_key
    from serving.testmodels_llm import build_lora_adapter, build_tiny_llama

    bundle = build_tiny_llama(root / "bench-llm", max_model_len=512, layers=LAYERS, hidden_size=hidden)
    adapter = build_lora_adapter(root / "adapter", bundle.path, rank=rank)
    options = ["dtype=float32", "max_model_len=512", f"max_lora_rank={rank}"]
    key = engine_key("bench-llm", 1, {"dtype": "float32", "max_model_len": 512})  # LoRA sizing is not in the key
    words, stack, rows = corpus_words(), LLMStack(root), []
    try:
        stack.start()
        stack.cli("model", "upload", "--name", "bench-llm", "--path", str(bundle.path))
        stack.cli("model", "upload", "--name", "bot", "--path", str(adapter), "--base", "bench-llm:1")
        stack.deploy("base", "bench-llm:1", options)
        stack.deploy("bot", "bot:1", options)
        stack.wait_ready(key, adapters=1)
        url = f"{stack.worker}/serve/openai/v1/chat/completions"
        for system in ENDPOINTS:  # warm-up: the first requests of each pay for the engine's first batches
            asyncio.run(one_pass(url, ENDPOINTS[system], 2, 2, 8, words, 1))
        for streams in levels:
            passes: dict[str, list[Run]] = {s: [] for s in ENDPOINTS}
            for i, system in enumerate(ORDER):
                passes[system].append(asyncio.run(one_pass(url, ENDPOINTS[system], streams, requests, max_tokens,
                                                           words, 100 * streams + i)))
            for system in ENDPOINTS:
                rows.append(merged(system, streams, passes[system]))
                console.print(rows[-1])
    finally:
        stack.stop()
    ratios = []
    for streams in levels:
        by = {r["system"]: r for r in rows if r["streams"] == streams}
        ratios.append({"streams": streams, "adapter_vs_base_tokens_per_s": round(
            by["adapter"]["output_tokens_per_s"] / by["base"]["output_tokens_per_s"], 3)
            if by["base"]["output_tokens_per_s"] else None})
    return {"levels": rows, "ratios": ratios, "requests_per_stream": requests, "max_tokens": max_tokens,
            "hidden_size": hidden, "layers": LAYERS, "lora_rank": rank, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def print_table(result: dict) -> None:
    table = Table(title=f"a LoRA adapter (rank {result['lora_rank']}) against its base, one engine, "
                        f"{result['max_tokens']} tokens out")
    for col in ("streams", "system", "output tok/s", "vs base", "TTFT p50 ms", "TTFT p90 ms", "errors"):
        table.add_column(col, justify="right")
    ratio = {r["streams"]: r["adapter_vs_base_tokens_per_s"] for r in result["ratios"]}
    for r in result["levels"]:
        table.add_row(str(r["streams"]), r["system"], f"{r['output_tokens_per_s']:.1f}",
                      f"{ratio[r['streams']]:.2f}x" if r["system"] == "adapter" and ratio[r["streams"]] else "",
                      f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p90_ms']:.0f}", str(r["errors"]))
    console.print(table)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r["streams"] for r in result["levels"]})
    x = np.arange(len(levels))
    fig, ax = plt.subplots(figsize=(6, 4))
    for offset, system in ((-0.2, "base"), (0.2, "adapter")):
        tps = [next(r["output_tokens_per_s"] for r in result["levels"] if r["streams"] == n and r["system"] == system)
               for n in levels]
        ax.bar(x + offset, tps, 0.4, label=system)
    ax.set_xticks(x, [f"{n} stream{'s' if n > 1 else ''}" for n in levels])
    ax.set_ylabel("output tokens/s")
    ax.legend()
    ax.set_title("LoRA adapter vs its base, one vLLM engine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="1,8", help="comma-separated numbers of concurrent streams")
    ap.add_argument("--requests", type=int, default=16, help="requests per stream and pass")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256, help="the model's hidden size (4 layers, heads of 32)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 requests per stream, 8 tokens")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.hidden = 2, 8, 64
    levels = [int(n) for n in args.streams.split(",")]
    with tempfile.TemporaryDirectory(prefix="llm-lora-") as tmp:
        result = run(levels, args.requests, args.max_tokens, args.hidden, args.rank, Path(tmp))
    print_table(result)
    save(result, args.out, "llm_lora", plot)
    return result


if __name__ == "__main__":
    main()
