"""``python -m benchmarks.llm_routing [--conversations 12] [--turns 3] [--streams 4] [--context 1500] [--repeats 1] [--quick]``.

The routing policies (docs/llm-routing.md) side by side in one run, on one engine of two replicas, and
vLLM's own router (``vllm-router`` 0.1.17, ``--policy cache_aware`` and ``round_robin``) in front of the
same two replicas (``--systems`` picks which):
the platform as `serving up` runs it (control plane, the LLM launcher, one worker), the launcher pinning
each vLLM replica to a core of its own. Four endpoints deploy the same version with the same options and
differ only in ``routing``, so they share the two replicas; each policy gets conversations of its own
(another seed), so what one policy left in the prefix cache does not help the next.

Workload: multi-turn chats, each conversation with its own long system prompt (``--context`` tokens,
random words of the tokenizer's corpus) and ``--turns`` user turns, each answer (``--max-tokens``,
greedy, ``ignore_eos``) appended before the next turn. ``--streams`` clients run at once; each holds
``conversations / streams`` conversations and takes them turn by turn in rotation, so between two turns
of a conversation the other conversations pass through the engines. The model (``--hidden``, 4 layers)
is wide enough that prefill is most of a request's time, and each replica's KV cache
(``kv_cache_space_gb``) holds about ``--cache-share`` of all conversations' tokens: a replica that sees
every conversation evicts, one that sees only its own keeps them.

With ``--repeats N`` each policy runs N passes, in ABBA order over the policies (a drifting machine
weighs on all alike), each pass on conversations of its own; a policy's figures pool its passes: its
TTFT percentiles are over all its requests. p90 is the ~14th-slowest of one pass's 144 requests (12
turns), after the 12 first turns, which no cache can help: one pass's p90 moves by a third between
runs of the same code, and pooling passes steadies it.

Figures per policy: TTFT p50/p90 (request sent to the first content chunk, measured by the client),
output tokens/s (completion tokens over the policy's wall time), and the prefix-cache hit rate from vLLM's
own counters (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``, both replicas, the
policy's delta). Writes ``results/llm_routing.json`` and ``results/llm_routing.png``.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.llm_stack import LLMStack, corpus_words, save
from benchmarks.procs import free_port, stop, wait_http
from serving.llm.engines.sse import DONE, read_events

RESULTS_DIR = Path(__file__).resolve().parent / "results"
POLICIES = {"round-robin": "rr", "least-loaded": "ll", "prefix": "pfx", "session": "sess"}
# vLLM's own Rust router (``vllm-router``) in front of the same two replicas, by its policy name: the peer
# the platform's policies are measured against. It routes on the engine's served name, not an endpoint.
ROUTER_POLICIES = {"vllm-router cache_aware": "cache_aware", "vllm-router round_robin": "round_robin"}
LAYERS = 4
console = Console(width=132)


@dataclass
class Run:
    policy: str
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    hits: float = 0.0
    queries: float = 0.0
    passes: list[dict] = field(default_factory=list)

    def add(self, other: "Run") -> None:
        """Pool another pass of the same policy: its requests, its time, its cache counters."""
        for name in ("requests", "errors", "output_tokens", "wall_s", "ttft_s", "prompt_tokens", "hits", "queries"):
            setattr(self, name, getattr(self, name) + getattr(other, name))  # numbers add, lists join
        self.passes.append({k: v for k, v in other.summary().items() if k != "passes"})

    def summary(self) -> dict:
        ttft = np.array(self.ttft_s) * 1000 if self.ttft_s else np.array([np.nan])
        return {"policy": self.policy, "requests": self.requests, "errors": self.errors,
                "output_tokens_per_s": round(self.output_tokens / self.wall_s, 1) if self.wall_s else 0.0,
                "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
                "ttft_p90_ms": round(float(np.percentile(ttft, 90)), 1),
                "prefix_cache_hit_rate": round(self.hits / self.queries, 3) if self.queries else None,
                "mean_prompt_tokens": round(float(np.mean(self.prompt_tokens)), 1) if self.prompt_tokens else None,
                "wall_s": round(self.wall_s, 2), "passes": self.passes}


def conversation(rng: random.Random, words: list[str], context: int) -> list[dict]:
    return [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(context))}]


async def turn(session: aiohttp.ClientSession, url: str, model: str, conv_id: str, messages: list[dict],
               max_tokens: int, run: Run) -> str:
    """One streamed chat turn; returns the answer's text."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0, first, text, usage = time.perf_counter(), None, [], {}
    async with session.post(url, json=body, headers={"X-Session-Id": conv_id}) as r:
        if r.status != 200:
            await r.read()
            run.errors += 1
            return ""
        async for batch in read_events(data async for data, _ in r.content.iter_chunks()):
            now = time.perf_counter()
            for sse in batch:
                if sse.data == DONE:
                    continue
                event = orjson.loads(sse.data)
                for choice in event.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        first = first or now
                        text.append(content)
                usage = event.get("usage") or usage
    if first is None and not usage:
        run.errors += 1
        return ""
    run.requests += 1
    if first is not None:  # a random-weight model may answer only tokens that decode to nothing: no TTFT
        run.ttft_s.append(first - t0)
    run.output_tokens += int(usage.get("completion_tokens") or 0)
    run.prompt_tokens.append(int(usage.get("prompt_tokens") or 0))
    return "".join(text)


async def drive(url: str, policy: str, seed: int, words: list[str], conversations: int, turns: int, streams: int,
                context: int, max_tokens: int, into: Run | None = None, model: str | None = None) -> Run:
    """``model``: what the requests name (a platform policy's endpoint by default; the served name for
    vllm-router)."""
    run = into or Run(policy)
    rng = random.Random(seed)
    convs = {f"{policy}-{seed}-{c}": conversation(rng, words, context) for c in range(conversations)}
    ids = list(convs)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async def client(mine: list[str]) -> None:
            for t in range(turns):
                for conv_id in mine:
                    messages = convs[conv_id]
                    messages.append({"role": "user", "content": f"question {t}: " + " ".join(
                        rng.choice(words) for _ in range(12))})
                    answer = await turn(session, url, model or POLICIES[policy], conv_id, messages, max_tokens, run)
                    messages.append({"role": "assistant", "content": answer})

        t0 = time.perf_counter()
        await asyncio.gather(*(client(ids[i::streams]) for i in range(streams)))
        run.wall_s = time.perf_counter() - t0
    return run


def counters(launcher: str, key: str) -> tuple[float, float]:
    """vLLM's prefix-cache hits and queries (tokens), summed over the engine's replicas."""
    replicas = httpx.get(f"{launcher}/engines", timeout=10).json()["engines"][key]["replicas"]
    hits = queries = 0.0
    for r in replicas:
        text = httpx.get(r["url"].removesuffix("/v1") + "/metrics", timeout=10).text
        hits += sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M))
        queries += sum(float(v) for v in re.findall(r"^vllm:prefix_cache_queries_total(?:\{[^}]*\})? (\S+)$",
                                                    text, re.M))
    return hits, queries


def start_router(stack: LLMStack, key: str, policy: str) -> tuple[subprocess.Popen, str]:
    """vllm-router with ``policy`` over the engine's replicas; its base URL."""
    replicas = [r["url"].removesuffix("/v1") for r in stack.engine(key)["replicas"]]
    port = free_port()
    log = open(stack.root / f"vllm-router-{policy}.log", "ab")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "vllm-router"), "--worker-urls", *replicas,
                             "--policy", policy, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                             "--prometheus-port", str(free_port())],  # its default, 29000, fits one router a host
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/models", 60, [proc])
    return proc, url


def run(conversations: int, turns: int, streams: int, context: int, max_tokens: int, hidden: int,
        cache_share: float, root: Path, repeats: int = 1, systems: list[str] | None = None) -> dict:
    """``systems``: platform policies (POLICIES) and vllm-router policies (ROUTER_POLICIES), by name."""
    from serving.llm.naming import engine_key
    from serving.testmodels_llm import build_tiny_llama

    systems = systems or list(POLICIES)
    max_len = 1 << (context + turns * (max_tokens + 40)).bit_length()
    bundle = build_tiny_llama(root / "bench-llm", max_model_len=max_len, layers=LAYERS, hidden_size=hidden)
    token_bytes = 2 * LAYERS * hidden * 4  # keys and values, float32
    total = conversations * (context + turns * (max_tokens + 30)) * token_bytes
    kv_gb = round(max(cache_share * total, 2.5 * max_len * token_bytes) / (1 << 30), 4)
    options = ["dtype=float32", f"max_model_len={max_len}", "replicas=2", f"kv_cache_space_gb={kv_gb}"]
    key = engine_key("bench-llm", 1, {"dtype": "float32", "max_model_len": max_len, "kv_cache_space_gb": kv_gb})
    words, stack, runs, routers = corpus_words(), LLMStack(root), [], []
    repeats = max(1, repeats)
    try:
        stack.start()
        stack.cli("model", "upload", "--name", "bench-llm", "--path", str(bundle.path))
        for policy, endpoint in POLICIES.items():
            stack.deploy(endpoint, "bench-llm:1", [*options, f"routing={policy}"])
        stack.wait_ready(key)
        chat = "/v1/chat/completions"
        targets = {policy: (f"{stack.worker}/serve/openai{chat}", None) for policy in POLICIES}
        for name in systems:
            if name in ROUTER_POLICIES:
                proc, url = start_router(stack, key, ROUTER_POLICIES[name])
                routers.append(proc)
                targets[name] = (f"{url}{chat}", key)
        warm = Run("warm-up")  # the first requests of each replica pay for its warm-up: not any system's
        asyncio.run(drive(targets["round-robin"][0], "round-robin", 1, words, 4, 1, 4, 32, max_tokens, warm))
        pooled = {name: Run(name) for name in systems}
        for rep in range(repeats):
            for name in (systems if rep % 2 == 0 else systems[::-1]):
                one = Run(name)
                url, model = targets[name]
                before = counters(stack.launcher, key)
                asyncio.run(drive(url, name, 1000 + 10 * rep + systems.index(name), words, conversations,
                                  turns, streams, context, max_tokens, one, model))
                after = counters(stack.launcher, key)
                one.hits, one.queries = after[0] - before[0], after[1] - before[1]
                pooled[name].add(one)
                console.print(f"pass {rep + 1}: {name:24} {one.summary()}")
        runs = [pooled[name].summary() for name in systems]
        for r in runs:
            console.print(f"{r['policy']:24} {r}")
    finally:
        for proc in routers:
            stop(proc)
        stack.stop()
    return {"conversations": conversations, "turns": turns, "streams": streams, "context_words": context,
            "max_tokens": max_tokens, "hidden_size": hidden, "layers": LAYERS, "max_model_len": max_len,
            "kv_cache_space_gb_per_replica": kv_gb, "cache_share": cache_share, "repeats": repeats, "runs": runs,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average": " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())}


def print_table(result: dict) -> None:
    passes = result.get("repeats", 1)
    table = Table(title=f"routing over 2 replicas: {result['conversations']} conversations x {result['turns']} turns, "
                        f"{result['streams']} streams, ~{result['context_words']}-token contexts"
                        + (f", {passes} passes pooled" if passes > 1 else ""))
    for col in ("system", "TTFT p50 ms", "TTFT p90 ms", "output tok/s", "prefix-cache hit rate", "errors",
                *(["TTFT p90 ms per pass"] if passes > 1 else [])):
        table.add_column(col, justify="right")
    for r in result["runs"]:
        table.add_row(r["policy"], f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p90_ms']:.0f}", f"{r['output_tokens_per_s']:.1f}",
                      "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.1%}",
                      str(r["errors"]),
                      *([" / ".join(f"{p['ttft_p90_ms']:.0f}" for p in r.get("passes", []))] if passes > 1 else []))
    console.print(table)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["policy"] for r in result["runs"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = np.arange(len(names))
    a.bar(x - 0.2, [r["ttft_p50_ms"] for r in result["runs"]], 0.4, label="p50")
    a.bar(x + 0.2, [r["ttft_p90_ms"] for r in result["runs"]], 0.4, label="p90")
    a.set_xticks(x, names, rotation=20, ha="right")
    a.set_ylabel("TTFT (ms)")
    a.legend()
    b.bar(x, [r["prefix_cache_hit_rate"] or 0 for r in result["runs"]])
    b.set_xticks(x, names, rotation=20, ha="right")
    b.set_ylabel("vLLM prefix-cache hit rate")
    fig.suptitle("LLM routing policies, 2 vLLM replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--context", type=int, default=1500, help="words of each conversation's system prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512, help="the model's hidden size (4 layers, heads of 32)")
    ap.add_argument("--cache-share", type=float, default=0.6,
                    help="each replica's KV cache as a share of all conversations' tokens")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes per policy, in ABBA order; a policy's figures pool its passes")
    ap.add_argument("--systems", default=",".join([*POLICIES, *ROUTER_POLICIES]),
                    help="comma-separated: the platform's policies and vllm-router's, by name")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 conversations of 300 words, 2 turns")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    ap.add_argument("--name", default="llm_routing", help="the results' file names (JSON and plot)")
    args = ap.parse_args(argv)
    if args.quick:
        args.conversations, args.turns, args.context, args.hidden = 4, 2, 300, 128
    with tempfile.TemporaryDirectory(prefix="llm-routing-") as tmp:
        result = run(args.conversations, args.turns, args.streams, args.context, args.max_tokens, args.hidden,
                     args.cache_share, Path(tmp), args.repeats, args.systems.split(","))
    print_table(result)
    save(result, args.out, args.name, plot)
    return result


if __name__ == "__main__":
    main()
